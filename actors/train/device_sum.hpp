#pragma once
/// Where a trainer group sums its gradients, decided and set up by every rank in step — the part
/// `weft train --trainers K` (actors/train/trainer.cpp) and `weft rl --trainers K`
/// (actors/rl/remote_trainers.cpp, rl_trainer.cpp) share: every rank's (host, GPU) key gathered
/// over the group, the --dist-backend choice (gradient_backend.hpp, the same on every rank) and,
/// for the GPUs, the group's communicator (transport::device_group). No CAF.

#include <cstdint>
#include <memory>
#include <string>

#include "schema/status.hpp"
#include "transport/device_group.hpp"
#include "transport/peer_group.hpp"

namespace weft::train {

struct device_sum {
  /// The communicator that sums on the GPUs; null: the gradients are summed in host memory.
  std::unique_ptr<transport::device_group> group;
  /// Why not on the GPUs (the choice's reason, or the communicator's failure under "auto").
  std::string why;
  bool join_failed = false;  ///< "auto" chose the GPUs but the communicator did not form
};

/// The CUDA ordinal a --device names ("cuda" is 0, "cuda:N" is N), or −1: not a CUDA device.
int cuda_ordinal(const std::string& device);

/// Every rank calls it at the same point. `requested`: "auto", "nccl" or "ucx"; `cuda_device`:
/// this rank's CUDA ordinal when it trains device-resident on a GPU, else −1. Errors:
/// errc::unavailable when a peer was lost meanwhile (form the group again), invalid_argument
/// when "nccl" cannot be had (the run must stop; the message starts with "--dist-backend nccl:").
result<device_sum> form_device_sum(transport::peer_group& peers, const std::string& requested,
                                   int cuda_device, uint32_t timeout_ms,
                                   const std::string& engine = "nccl");

}  // namespace weft::train
