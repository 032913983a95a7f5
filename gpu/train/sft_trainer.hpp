#pragma once
/// The supervised fine-tuning loop of one trainer rank (docs/training.md): take the rank's share of
/// a step's examples in micro-batches, accumulate gradients, sum them over the ranks (a hook the
/// trainer actors fill with an all-reduce; identity for a single process), normalise by the step's
/// loss tokens, clip, AdamW with the schedule; exact snapshots for checkpoints. Plain class: no
/// CAF.

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "gpu/status.hpp"
#include "gpu/train/checkpoint.hpp"
#include "gpu/train/optimizer.hpp"
#include "gpu/train/sft_data.hpp"
#include "gpu/train/trainable_model.hpp"

namespace weft::gpu::train {

struct sft_config {
  uint64_t seed = 0;
  int64_t step_tokens = 4096;         ///< Tokens per optimizer update (all ranks together).
  int64_t micro_batch_tokens = 1024;  ///< Tokens per forward/backward.
  lr_schedule schedule;
  adamw_config adamw;
  double max_grad_norm = 1.0;  ///< <= 0: no clipping.
  /// Shares of each rank's examples computed at once, one thread each (trainable_model's parallel
  /// forward_backward; run BLAS single-threaded then). The bits depend on it (the shares' gradients
  /// are added in share order), so an exact resume needs the same value.
  int parallel = 1;
  /// With the model on a device: keep AdamW and the master weights on the host (DeepSpeed's
  /// ZeRO-Offload: gradients come back after every micro-batch, weights go up after every update)
  /// instead of the default device-resident step (trainable_model::set_device_resident), which
  /// keeps everything on the device and copies to the host only for checkpoints and export.
  bool offload_optimizer = false;
};

/// Sums the ranks' gradients (every tensor, in place) and their loss sums and token counts; every
/// rank must get the same result in the same order. Null: a single rank.
using gradient_reducer = std::function<status(std::span<const std::span<float>> grads,
                                              double& loss_sum, int64_t& loss_tokens)>;

/// The same for gradients that stay in device memory (device-resident training): `grads` are the
/// device's buffers (trainable_model::device_gradients), summed in place, e.g. by NCCL.
using device_gradient_reducer = std::function<status(std::span<const std::span<float>> grads,
                                                     double& loss_sum, int64_t& loss_tokens)>;

/// A data-parallel reduction that overlaps the backward (trainer groups' --bucket-mb; PyTorch
/// DDP's buckets): `begin` gets the host gradient buffers before a step's backward, `ready` each
/// group of trainable_model::gradient_groups as the backward finishes it (from the backward's
/// threads), and `finish`, after the backward, sums whatever is left and the loss sums and token
/// counts — in all, what a gradient_reducer does, with the same bits. `abandon`: the backward
/// failed; nothing more is started and what is in flight ends.
class overlapped_reducer {
 public:
  virtual ~overlapped_reducer() = default;
  virtual void begin(std::span<const std::span<float>> grads) = 0;
  virtual void ready(size_t group) = 0;
  virtual status finish(double& loss_sum, int64_t& loss_tokens) = 0;
  virtual void abandon() = 0;
};

/// A held-out evaluation (`weft train --eval-data`): the mean cross-entropy over the data's loss
/// tokens under the weights after `step` updates.
struct eval_record {
  int64_t step = 0;
  double loss = 0.0;     ///< mean −log p over the loss tokens (nats)
  double nll_sum = 0.0;  ///< their sum (what a group of ranks adds up before dividing)
  int64_t tokens = 0;    ///< loss tokens
  int64_t examples = 0;
  double seconds = 0.0;
};

/// Forward passes only, the examples in file order packed whole into batches of at most
/// `batch_tokens` tokens (a longer example alone). Device-resident models evaluate where they
/// are. The weights and the gradients are not touched.
result<eval_record> evaluate_loss(trainable_model<float>& model, const sft_dataset& data,
                                  int64_t batch_tokens);

class sft_trainer {
 public:
  /// `rank` of `world` ranks trains on its share of every step's examples (sft_sampler::next_step
  /// balances the ranks' tokens).
  sft_trainer(trainable_model<float>& model, const sft_dataset& data, const sft_config& config,
              gradient_reducer reduce = nullptr, int rank = 0, int world = 1);

  /// With a device-resident model: sum the gradients where they are with `reduce` instead of
  /// copying them to the host for the reducer given at construction (which then is not called).
  void set_device_reducer(device_gradient_reducer reduce) { device_reduce_ = std::move(reduce); }
  /// Host steps sum the gradients with `r` during the backward instead of with the reducer given
  /// at construction after it (null: back to that). `r` must outlive its use.
  void set_overlapped_reducer(overlapped_reducer* r) { overlap_ = r; }

  /// One optimizer update; its record (mean loss over the step's loss tokens, lr, norm).
  result<step_record> step();

  /// Updates done.
  int64_t steps_done() const { return step_; }
  const std::vector<step_record>& history() const { return history_; }

  /// A copy of everything needed to continue exactly (brings the host copy of a device-resident
  /// model up to date first).
  result<checkpoint_state> snapshot();
  /// The same copy into `s`, reusing its buffers (async_checkpointer's staging copy).
  status snapshot_into(checkpoint_state& s);
  /// The same without a copy: `meta` gets everything but the tensors, and the view borrows it and
  /// the live parameters and moments (valid until the next step).
  result<checkpoint_view> live_checkpoint(checkpoint_state& meta);
  /// Brings the model's host parameters (and the optimizer's moments) up to date with the device
  /// after device-resident steps (before an export; snapshot_into does it itself).
  status sync_host();
  /// Continues from a snapshot of the same model and data (names and sizes are checked).
  status restore(const checkpoint_state& s);

 private:
  /// Reduce (unless `reduced`), scale, clip and AdamW on the host copy (the model is not
  /// device-resident).
  result<double> host_update(double& loss_sum, int64_t& loss_tokens, double lr, bool reduced);
  /// `s`'s step, cursor, seed, schedule and history, the host copy brought up to date first.
  status checkpoint_meta(checkpoint_state& s);

  trainable_model<float>& model_;
  sft_config config_;
  sft_sampler sampler_;
  gradient_reducer reduce_;
  device_gradient_reducer device_reduce_;
  overlapped_reducer* overlap_ = nullptr;
  int rank_, world_;
  adamw opt_;
  int64_t step_ = 0;
  std::vector<step_record> history_;
  std::vector<uint8_t> decay_;
};

}  // namespace weft::gpu::train
