// Fuzz target: the first two bytes choose a message kind, the rest are the bytes a peer sent.
// Decoding must return a value or an error for every input — never crash, hang or over-allocate.

#include <cstddef>
#include <cstdint>

#include "schema/envelope.hpp"

namespace {

template <class T>
void read_all(const weft::schema::envelope& env) {
  auto v = env.read<T>();
  if (v.ok()) {
    // A validated view must be safe to read in full.
    auto r = v->get();
    (void)r.totalSize();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weft::schema;
  if (size < 2) return 0;
  auto k = static_cast<kind>((data[0] | (data[1] << 8)) %
                             33);  // every kind up to CacheShardLoad, and none
  auto env = envelope::from_bytes(k, {reinterpret_cast<const std::byte*>(data + 2), size - 2});
  switch (k) {
    case kind::error:
      read_all<wire::Error>(env);
      break;
    case kind::join_request:
      read_all<wire::JoinRequest>(env);
      break;
    case kind::spawn_request:
      read_all<wire::SpawnRequest>(env);
      break;
    case kind::node_status:
      read_all<wire::NodeStatus>(env);
      break;
    case kind::cluster_status:
      read_all<wire::ClusterStatus>(env);
      break;
    case kind::transfer_request:
      read_all<wire::TransferRequest>(env);
      break;
    case kind::supervisor_spec:
      read_all<wire::SupervisorSpec>(env);
      break;
    default:
      read_all<wire::Heartbeat>(env);
      break;
  }
  return 0;
}
