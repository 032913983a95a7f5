# The messages of the judge stage: your own schema, carried by weft like its own
# (schema::envelope::build_user / read_user validate them against this schema).
@0xd1f4a7c2e5b3a901;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("judge");

struct Question {
  id @0 :UInt64;
  text @1 :Text;
  maxTokens @2 :UInt32 = 48;
}

struct Verdict {
  id @0 :UInt64;
  answer @1 :Text;      # the pool's answer to the question
  judgement @2 :Text;   # the pool's judgement of that answer
  accepted @3 :Bool;    # the judgement starts with "yes"
  workers @4 :List(Text);  # the engine workers that produced answer and judgement
}
