#pragma once
/// Where a trainer group sums its gradients (`weft train --dist-backend`, docs/training.md):
/// "nccl" — on the GPUs, in place (transport::device_group), when every rank trains
/// device-resident on a GPU of its own; "ucx" — copied to host memory and summed over the
/// transport's peer group (any device, any host); "auto" — nccl where every rank can, else ucx,
/// saying why. Every rank must decide the same, so the decision is made from every rank's key,
/// gathered over the group. Plain code: no CAF.

#include <cstdint>
#include <string>
#include <vector>

namespace weft::train {

/// A rank's key for the choice: nonzero names its (host, GPU) pair; 0 says it cannot use the
/// device path (it trains on the host, or keeps its gradients there).
uint64_t device_key(uint64_t host_key, int gpu);

struct gradient_backend_choice {
  bool device = false;   ///< sum on the GPUs
  bool refused = false;  ///< "nccl" was asked for and some rank cannot: the run must not start
  std::string why;       ///< why not the device path (for the log or the error)
};

/// `requested`: "auto", "nccl" or "ucx"; `keys`: every rank's device_key, by rank.
gradient_backend_choice choose_gradient_backend(const std::string& requested,
                                                const std::vector<uint64_t>& keys);

}  // namespace weft::train
