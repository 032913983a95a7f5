// Routing replay (RL, docs/rl.md): the experts each computed token of a request was routed to,
// kept per request for its last output and beside the token's K/V in the cache (kv_cache's slot
// payload), so that a prefix-cache hit brings the routes of the pass that computed the blocks.
#include <algorithm>
#include <vector>

#include "gpu/engine.hpp"

namespace weft::gpu {

void engine::record_routes(request& r, int32_t si, const forward_batch& batch,
                           const forward_output& fout) {
  // Every layer of the Mixtral layout routes (engine::create checked the model records them).
  const int64_t n_layers =
      std::min<int64_t>(model_.hparams().n_layers, static_cast<int64_t>(fout.expert_ids.size()));
  const int64_t k = model_.hparams().n_experts_used;
  const int64_t per = model_.hparams().n_layers * k;
  int64_t pos = r.n_computed;  // positions are recomputed in place after a preemption
  for (size_t b = 0; b < batch.seq_index.size(); ++b) {
    if (batch.seq_index[b] != si) continue;
    if (static_cast<int64_t>(r.routes.size()) < (pos + 1) * per)
      r.routes.resize(static_cast<size_t>((pos + 1) * per));
    for (int64_t l = 0; l < n_layers; ++l) {
      const auto& ids = fout.expert_ids[static_cast<size_t>(l)];
      for (int64_t j = 0; j < k; ++j)
        r.routes[static_cast<size_t>(pos * per + l * k + j)] =
            static_cast<uint8_t>(ids[b * static_cast<size_t>(k) + static_cast<size_t>(j)]);
    }
    ++pos;
  }
  r.routes.resize(static_cast<size_t>(pos * per));
  // The same routes beside the tokens' K/V (kv_cache's slot payload), for later prefix hits.
  std::vector<int32_t> slots;
  if (auto st = kv_->slots(r.seq, r.n_computed, pos - r.n_computed, slots); !st) {
    r.routes_error = "routing replay: cannot keep the routes beside the KV: " + st.to_string();
    return;
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    std::copy_n(r.routes.begin() + (r.n_computed + static_cast<int64_t>(i)) * per, per,
                kv_->slot_payload(slots[i]));
  }
}

void engine::cached_routes(request& r, int64_t n) {
  const int64_t per = model_.hparams().n_layers * model_.hparams().n_experts_used;
  std::vector<int32_t> slots;
  if (auto st = kv_->slots(r.seq, 0, n, slots); !st) {
    r.routes_error = "routing replay: cannot read the cached blocks' routes: " + st.to_string();
    return;
  }
  r.routes.resize(static_cast<size_t>(n * per));
  for (size_t i = 0; i < slots.size(); ++i)
    std::copy_n(kv_->slot_payload(slots[i]), per, r.routes.begin() + static_cast<int64_t>(i) * per);
}

}  // namespace weft::gpu
