# A schema weft does not know: what an embedder's own messages look like (tests/unit/schema).
@0x80902ef3afee0142;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("weft_test_user");

enum Verdict {
  accept @0;
  reject @1;
}

struct JudgeRequest {
  id @0 :UInt64;
  prompt @1 :Text;
  scores @2 :List(Float32);
}

struct JudgeReply {
  id @0 :UInt64;
  verdict @1 :Verdict;
  reason @2 :Text;
}
