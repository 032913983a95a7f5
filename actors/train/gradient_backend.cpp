#include "actors/train/gradient_backend.hpp"

#include <xxhash.h>

#include <map>

namespace weft::train {

uint64_t device_key(uint64_t host_key, int gpu) {
  const uint64_t parts[2] = {host_key, static_cast<uint64_t>(gpu)};
  const uint64_t k = XXH3_64bits(parts, sizeof parts);
  return k == 0 ? 1 : k;
}

gradient_backend_choice choose_gradient_backend(const std::string& requested,
                                                const std::vector<uint64_t>& keys) {
  gradient_backend_choice c;
  if (requested == "ucx") {
    c.why = "--dist-backend ucx";
    return c;
  }
  if (keys.size() < 2) {
    c.why = "a single rank has nothing to sum";
    return c;
  }
  std::map<uint64_t, size_t> first_rank;
  for (size_t r = 0; r < keys.size() && c.why.empty(); ++r) {
    if (keys[r] == 0) {
      c.why =
          "rank " + std::to_string(r) +
          " keeps its gradients in host memory (it trains on the host or a CPU device, or offloads "
          "its optimizer)";
    } else if (auto [it, fresh] = first_rank.emplace(keys[r], r); !fresh) {
      c.why = "ranks " + std::to_string(it->second) + " and " + std::to_string(r) +
              " share one GPU (NCCL needs a GPU per rank)";
    }
  }
  c.device = c.why.empty();
  c.refused = !c.device && requested == "nccl";
  return c;
}

}  // namespace weft::train
