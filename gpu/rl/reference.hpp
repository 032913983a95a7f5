#pragma once
/// The frozen reference policy of GRPO's KL term (docs/rl.md, "KL to the reference"): the
/// starting weights' log-probability — of log-softmax(logits / temperature) — of every target of
/// a packed batch. It runs in this process (local_reference) or on nodes of its own
/// (actors/rl/remote_reference.hpp, `weft rl --reference-workers K`); both give the same bits.
/// Plain class, no CAF.

#include <memory>
#include <span>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/gguf.hpp"
#include "gpu/status.hpp"
#include "gpu/train/trainable_model.hpp"

namespace weft::gpu::rl {

class reference_policy {
 public:
  virtual ~reference_policy() = default;
  /// For each batch, the log-probs of its targets in position order. Routes are ignored: the
  /// reference routes every token itself. An implementation may compute the batches in parallel.
  virtual result<std::vector<std::vector<float>>> logprobs(
      std::span<const train::train_batch* const> batches) = 0;
  /// Whether its calls compute on other hardware (reference workers): the RL loop then makes
  /// its fused calls from a thread of its own and goes on generating meanwhile. An in-process
  /// reference computes on the loop's own cores, so it is called in the loop.
  virtual bool runs_elsewhere() const { return false; }
};

/// The reference in this process: `source`'s weights loaded a second time, on `dev` when not
/// null (which must outlive it).
result<std::unique_ptr<reference_policy>> load_local_reference(const gguf_file& source,
                                                               float temperature, device* dev);

/// Computes `batches` one after the other with `model` (the reference of a remote worker, too).
result<std::vector<std::vector<float>>> reference_logprobs(
    train::trainable_model<float>& model, std::span<const train::train_batch* const> batches);

}  // namespace weft::gpu::rl
