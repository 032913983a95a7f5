# The control messages of the tensor example: small descriptions of bulk bytes that move over the
# data plane (never through a mailbox). Your own schema, carried by weft's envelopes.
@0xe3b1c9a85f2d7046;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("tensor");

struct TensorOffer {
  name @0 :Text;
  dtype @1 :Text;
  shape @2 :List(UInt64);
  bytes @3 :UInt64;
  checksum @4 :UInt64;   # XXH3-64 of the bytes (weft::transport::checksum)
  address @5 :Data;      # the sender engine's address (engine::local_address)
  region @6 :Data;       # the tensor's remote descriptor (engine::describe)
  leaseMs @7 :UInt32;    # the sender releases the memory after this long
}

struct TensorReceived {
  name @0 :Text;
  checksum @1 :UInt64;   # of the bytes as they arrived
  micros @2 :UInt64;     # the pull's duration
  node @3 :UInt32;       # pid of the receiving process
}
