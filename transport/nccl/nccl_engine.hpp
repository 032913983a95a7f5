#pragma once
/// The NCCL backend: GPU collectives (broadcast, all_reduce) and send/recv within one group.
///
/// Built only when CMake finds CUDA (WEFT_WITH_CUDA); registered as "nccl". It cannot run on a
/// machine without a GPU: the factory then fails with no_device.
///
/// Params: "nccl.rank" (required), "nccl.world_size" (required), "nccl.device" (default 0).
/// Group bootstrap over the control plane: rank 0's local_address() is the group id (an
/// ncclUniqueId); every rank, rank 0 included, calls connect(group id), which joins the
/// communicator (blocking until all ranks joined, or failing with timeout when they have not
/// within engine_config::default_timeout_ms) and returns the handle of rank 0. The handle
/// of rank r is peer_of_rank(r). Regions must be GPU memory (allocate_memory(n, gpu) or
/// register_memory(device_ptr, n, gpu)). There is no one-sided access and tags are not matched:
/// send/recv pair up in issue order per peer, as in NCCL. A missed deadline aborts the
/// communicator (NCCL cannot cancel one operation): later transfers fail with peer_unreachable.

#include <memory>

#include "transport/engine.hpp"

namespace weft::transport::nccl {

/// Makes an NCCL engine; no_device when no GPU is visible.
result<std::unique_ptr<engine>> make_engine(const engine_config& config);

/// The peer handle that names `rank` in an NCCL engine's group.
inline peer_handle peer_of_rank(int rank) {
  return peer_handle{static_cast<std::uint64_t>(rank) + 1};
}

}  // namespace weft::transport::nccl
