#pragma once
/// One optimizer iteration of GRPO's update, shared by the trainer of a single process and by
/// every rank of a data-parallel trainer group (`weft rl --trainers K`, docs/rl.md "Trainer
/// groups"), plus the interface through which the GRPO loop (rank 0) drives the other ranks.
///
/// Data parallelism: the step's packed micro-batches are cut into lists, `shares` per rank; every
/// rank runs the forward and backward of its lists, the gradients (and the loss and objective
/// counters) are summed over the group in rank order — the same bits on every rank — and every
/// rank takes the same clipped AdamW step. The token weights already normalise the loss over the
/// whole step, so the sum is the full gradient. A run with K ranks repeats bit for bit; it differs
/// from a run with another K only by the order of the sums (float rounding).
/// Plain classes, no CAF.

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "gpu/rl/grpo.hpp"
#include "gpu/status.hpp"
#include "gpu/train/optimizer.hpp"
#include "gpu/train/sft_trainer.hpp"
#include "gpu/train/trainable_model.hpp"

namespace weft::gpu::rl {

/// One piece of an update's packing: samples of one prompt that train after one copy of its
/// prompt prefix.
struct update_unit {
  int64_t group = 0;
  std::vector<size_t> samples;  ///< Indices into the step's samples, in order.
  size_t prefix = 0;            ///< Tokens of the shared prompt prefix.
  size_t tokens = 0;            ///< prefix + the samples' own tokens
};

/// The units of an update and which of them each parallel share trains.
struct share_plan {
  std::vector<update_unit> units;
  std::vector<std::vector<size_t>> shares;  ///< Unit indices per share, ascending.
  size_t heaviest = 0;                      ///< Tokens of the heaviest share.
};

/// Assigns units to `shares` by tokens (largest first to the lightest share). Fewer units than
/// shares, or lopsided ones, would leave a share's thread idle for much of the update (a group
/// whose samples all have advantage 0 trains nothing, so one prompt may be all there is): the
/// largest unit's samples are split in two halves, each with its own copy of the prefix, for as
/// long as that lightens the heaviest share. A function of the token counts alone, so an update's
/// bits repeat. `sample_tokens(s)` is sample s's own token count.
share_plan plan_update_shares(std::vector<update_unit> units, int shares,
                              const std::function<size_t(size_t)>& sample_tokens);

/// Sums every gradient tensor and `scalars` element-wise over the group; every member gets the
/// same bits.
using group_reducer =
    std::function<status(std::span<const std::span<float>> grads, std::span<double> scalars)>;

/// What one iteration needs besides the batches (the same on every rank).
struct iteration_inputs {
  int64_t step = 0;       ///< The GRPO step (0-based) the update belongs to.
  int64_t iteration = 0;  ///< 0 .. updates_per_step − 1.
  double lr = 0.0;
  int64_t opt_step = 1;  ///< AdamW's update number (1-based).
  double max_grad_norm = 1.0;
};

/// Sums over the group after the iteration.
struct iteration_totals {
  double loss_sum = 0.0;
  double grad_norm = 0.0;  ///< Before clipping.
  int64_t tokens = 0, clipped = 0, abs_ratio_dev_nano = 0, kl_nano = 0;
  /// Routing replay (trainable_model::take_routing_stats), summed over the group.
  int64_t routes_replayed = 0, routes_differ = 0;
};

/// zero_grad, the forward and backward of the PPO objective over `lists` (this rank's, one thread
/// each, at least `shares` threads of gradient buffers), `reduce` (null: this is the only rank),
/// global-norm clipping and AdamW. The model must be host-resident.
///
/// With `overlap` (a trainer group's --bucket-mb), the gradients are summed while the backward
/// runs: `overlap` gets begin() before it and ready() for each finished gradient group (abandon()
/// if it fails), and `reduce` is then called as without it but must itself end the overlapped
/// sum (overlapped_reducer::finish) before it sums the scalars (trainer_wire's group_sum does).
/// The same bits either way.
result<iteration_totals> update_iteration(train::trainable_model<float>& model, train::adamw& opt,
                                          std::span<const uint8_t> decay, const grpo_config& g,
                                          const iteration_inputs& in, int shares,
                                          std::span<const std::vector<train::train_batch>> lists,
                                          const group_reducer& reduce,
                                          train::overlapped_reducer* overlap = nullptr);

/// The same iteration on a device-resident model (trainable_model::set_device_resident): the
/// forward and backward leave the gradients on the device, `reduce` (null: this is the only rank)
/// sums the device's gradient buffers in place (NCCL: `weft rl --trainers K --dist-backend`) and
/// the scalars, then clipping and AdamW run there (device_step). Nothing crosses the bus.
result<iteration_totals> device_update_iteration(
    train::trainable_model<float>& model, train::adamw& opt, std::span<const uint8_t> decay,
    const grpo_config& g, const iteration_inputs& in, int shares,
    std::span<const std::vector<train::train_batch>> lists, const group_reducer& reduce);

/// The trainer's state a joining rank needs, in a fixed order: every parameter's values, then
/// AdamW's first moments, then its second moments.
std::vector<std::span<float>> trainer_state(train::trainable_model<float>& model,
                                            train::adamw& opt);

/// Rank 0's trainer state (trainer_state, its host copy brought up to date first), asked for only
/// when a new group forms.
using state_source = std::function<result<std::vector<std::span<float>>>()>;

/// Ranks 1 .. world − 1 of a data-parallel trainer group whose rank 0 is this process
/// (actors/rl/remote_trainers implements it over UCX, and NCCL where every rank has a GPU).
class update_group {
 public:
  virtual ~update_group() = default;
  /// Ranks, this process included.
  virtual int world() const = 0;
  /// Blocks until a complete group is connected. A group that is new (the first call, or after a
  /// rank was lost) first receives `state()` (trainer_state of rank 0, in host memory).
  virtual status ready(const state_source& state) = 0;
  /// Whether the current group (after ready()) sums the gradients on the GPUs where they are
  /// computed: every rank then trains device-resident (device_update_iteration) and reduce()
  /// gets the device's gradient buffers. false: they are summed in host memory.
  virtual bool sums_on_device() const { return false; }
  /// Sends rank r (1 .. world − 1) its lists `per_rank[r − 1]` of iteration `in`.
  virtual status start(const iteration_inputs& in,
                       std::span<const std::vector<std::vector<train::train_batch>>> per_rank) = 0;
  /// The group's sum (see group_reducer): of host gradients, or of the device's gradient buffers
  /// when sums_on_device().
  virtual status reduce(std::span<const std::span<float>> grads, std::span<double> scalars) = 0;
  /// Whether the last failure of start/reduce/ready lost the group (a rank died or missed its
  /// deadline): the caller may repeat the iteration after ready() formed a new group.
  virtual bool lost() const = 0;
  /// Groups formed so far (1 + restarts once the first formed).
  virtual int64_t groups_formed() const = 0;
  /// Seconds spent in reduce() (waiting for the other ranks included) since the last call.
  virtual double take_reduce_seconds() = 0;
  /// For the current group (after ready()): the reducer that sums `model`'s gradients in buckets
  /// during the backward (update_iteration's `overlap`; reduce() then finishes it), or null: the
  /// sum runs in reduce(), after the backward.
  virtual train::overlapped_reducer* overlap(const train::trainable_model<float>& model) {
    (void)model;
    return nullptr;
  }
};

}  // namespace weft::gpu::rl
