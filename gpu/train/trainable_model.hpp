#pragma once
/// The Llama-family model as the trainer sees it (docs/training.md): every weight dequantized to
/// a dense T (f32 master weights for training, f64 for gradient checks), a forward pass over packed
/// variable-length sequences that keeps what the backward needs, and the backward pass. Plain
/// class: no CAF, no device; the trainer actors drive it.

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpu/gguf.hpp"
#include "gpu/model.hpp"
#include "gpu/status.hpp"
#include "gpu/train/optimizer.hpp"
#include "gpu/train/train_ops.hpp"

namespace weft::gpu::train {

/// One trainable tensor under its GGUF name. `ne` as in GGUF: ne[0] is the row length, so a
/// weight matrix [out][in] has ne = {in, out}; a norm weight has ne = {d, 1}.
template <class T>
struct parameter {
  std::string name;
  std::array<int64_t, 2> ne{0, 1};
  std::vector<T> value;
  std::vector<T> grad;
  int64_t size() const { return ne[0] * ne[1]; }
};

/// Per-token inputs of a policy-gradient objective (RL post-training, docs/rl.md).
struct policy_token {
  float behaviour_logp = 0.0f;  ///< log p of the token under the policy that sampled it.
  float advantage = 0.0f;
  float weight = 0.0f;    ///< The token's weight in the loss (the aggregation's normaliser).
  int32_t sample = -1;    ///< Index of the sample the token belongs to (the caller's numbering).
  float ref_logp = 0.0f;  ///< log p of the token under the reference policy (the KL term).
};

/// A micro-batch of sequences packed back to back. targets[i] is the token the model should
/// predict after tokens[i], or −1 when position i is not in the loss (prompt tokens, the last
/// token of a sequence).
struct train_batch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> targets;
  packed_sequences seqs;

  /// Appends one sequence. `in_loss[i]` (same length as `toks`) says whether toks[i] is a token
  /// the model is trained to produce (an assistant or completion token); toks[0] never is.
  void add(std::span<const int32_t> toks, std::span<const uint8_t> in_loss);
  /// The same, with policy-gradient inputs: info[i] (same length as `toks`) describes toks[i]
  /// and is stored in `policy` at the position that predicts it. `prefix` >= 0: the sequence
  /// continues the shared prefix of that index (add_prefix): toks[0] is at position
  /// length(prefix) and attends to the prefix; toks[0] itself is never in the loss.
  void add(std::span<const int32_t> toks, std::span<const uint8_t> in_loss,
           std::span<const policy_token> info, int64_t prefix = -1);
  /// Adds tokens that later sequences share as their prefix (none of them in the loss); returns
  /// the prefix's sequence index. The result equals packing each such sequence as prefix +
  /// sequence, with the prefix computed once (GRPO's samples share their prompt).
  int64_t add_prefix(std::span<const int32_t> toks);
  /// Positions with a target.
  int64_t n_loss_tokens() const;
  /// Per position (empty unless sequences were added with policy inputs): the inputs of the
  /// token that position predicts.
  std::vector<policy_token> policy;
  /// Mixture-of-experts routing replay (empty: the trainer routes every token): per position,
  /// route_width = layers · experts used entries, the experts each MoE layer sends the token to;
  /// a position past the end, or whose first entry is −1, is routed by the trainer.
  std::vector<int16_t> routes;
  int64_t route_width = 0;
  /// Sets the routes of positions [at, at + n) from `src` (n · width values, width = layers ·
  /// experts used); the positions before `at` that have none get −1.
  void set_routes(int64_t at, std::span<const uint8_t> src, int64_t width);
  int64_t n_tokens() const { return static_cast<int64_t>(tokens.size()); }
};

/// Sum of the per-token losses (−log p of each target) and how many there were.
struct loss_sum {
  double sum = 0.0;
  int64_t tokens = 0;
};

/// Options of the trainable model.
struct trainable_config {
  /// Per-layer activation checkpointing: keep only each layer's input and recompute the rest in
  /// the backward (about one extra forward of compute for a fraction of the memory).
  bool recompute = false;
  /// Rows of the output head computed at once (bounds the [rows][vocab] logits buffer).
  int64_t head_chunk_rows = 256;
  /// Mixture of experts: the load-balancing loss's coefficient (moe_ops.hpp, transformers'
  /// router_aux_loss_coef). Each micro-batch adds coef · aux · balance_weight: per loss token for
  /// cross-entropy, so a one-micro-batch step's mean loss is CE + coef · aux, as transformers'
  /// Mixtral; weighted like the policy loss for an RL objective.
  double router_aux_loss_coef = 0.0;
};

/// A per-token objective for policy-gradient training: given log p(target) at `positions` of
/// `batch` (one chunk of its loss positions), returns the summed loss Σ ℓ_i(logp_i) and writes
/// dℓ_i/dlogp_i into `dloss_dlogp`. Cross-entropy is ℓ = −logp. Called from the shares' threads:
/// it must be a pure function of its arguments.
template <class T>
using token_objective =
    std::function<double(const train_batch& batch, std::span<const int64_t> positions,
                         std::span<const T> logp, std::span<T> dloss_dlogp)>;

/// The weight of a micro-batch's load-balancing loss (trainable_config::router_aux_loss_coef):
/// its loss tokens `rows` for cross-entropy (the step divides by all of them), or the sum of their
/// policy weights for an RL objective (`policy`: those weights already normalise the step's loss).
double balance_weight(const train_batch& b, std::span<const int64_t> rows, bool policy);

class device_trainer;

template <class T>
class trainable_model {
 public:
  /// Dequantizes every weight of `file` into T (a nonzero router_aux_loss_coef needs an MoE file).
  /// Llama-family models, dense or mixture-of-experts (Mixtral's routing: softmax, top-k,
  /// renormalised; the router is trained through the chosen experts' weights).
  static result<std::unique_ptr<trainable_model>> load(const gguf_file& file,
                                                       const trainable_config& config = {});
  ~trainable_model();
  trainable_model(const trainable_model&) = delete;
  trainable_model& operator=(const trainable_model&) = delete;

  const model_hparams& hparams() const { return hp_; }
  const trainable_config& config() const { return config_; }
  /// The parameters (host memory, the master copy). Mutable access marks them changed: with a
  /// device attached, the next forward uploads them again.
  std::vector<parameter<T>>& parameters() {
    params_changed_ = true;
    settle_grads();
    return params_;
  }
  /// The same, read-only. The gradients read here are current once a forward_backward or a
  /// mutable access followed zero_grad (which only marks them zero; the first write clears them).
  const std::vector<parameter<T>>& parameters() const { return params_; }
  /// The parameter called `name`, or null.
  parameter<T>* find(std::string_view name);
  int64_t n_parameters() const;

  /// Runs forward and backward passes on `dev` from now on (null: back to the host), through its
  /// device::training() ops; f32 models only. The parameters stay on the host as the master copy
  /// (uploaded when changed), gradients are computed on the device and added into the host
  /// gradients before each forward_backward returns, and the optimizer runs on the host — the
  /// split of DeepSpeed's ZeRO-Offload. The device's results agree with the host's within
  /// rounding (docs/training.md), and are deterministic: the same calls give the same bits.
  /// `dev` must outlive the model, or be detached first (use_device(nullptr)).
  status use_device(device* dev);
  /// The device forward/backward run on, or null (the host).
  device* compute_device() const;

  /// Device-resident training (a device attached, f32): the gradients stay on the device between
  /// forward_backward calls (zero_grad clears them there; the host gradients are not touched),
  /// device_step runs the optimizer update there with AdamW's moments in device memory, and the
  /// host copies of the parameters and moments are brought up to date only by pull_to_host —
  /// nothing crosses the bus during a step. Off (the default): the ZeRO-Offload split above.
  status set_device_resident(bool on);
  bool device_resident() const;
  /// Resident mode: one update on the device — gradients × grad_scale, their global norm (double,
  /// tensors in order), clipping to max_norm (<= 0: none), then `opt`'s AdamW at `lr` with the
  /// weight decay where decay[i] is set; `opt`'s step count advances. The same order and element
  /// formulas as sft_trainer's host path (on the CPU device, the same bits). Returns the norm
  /// before clipping; a non-finite norm is an error naming update `step` and nothing is updated.
  result<double> device_step(adamw& opt, std::span<const uint8_t> decay, float grad_scale,
                             double max_norm, double lr, int64_t step);
  /// Resident mode: copies the device's gradients over the host's (the data-parallel reduction
  /// runs on the host), and back.
  status pull_gradients();
  status push_gradients();
  /// Resident mode: the device's gradient buffers themselves, one per parameter (zeroed if no
  /// forward/backward ran since zero_grad), with the device's queued work finished — for a
  /// reduction that runs on the device (NCCL) and leaves its sums in place.
  result<std::vector<std::span<float>>> device_gradients();
  /// Brings the host parameters (and `opt`'s moments, when given) up to date with the device's; a
  /// no-op when they are. Needed before reading the parameters after device_step (checkpoints,
  /// export: export_gguf refuses a stale copy).
  status pull_to_host(adamw* opt);
  /// Whether the host parameters are current (false after device_step until pull_to_host).
  bool host_current() const;
  /// The host parameters and `opt`'s moments were replaced (a restored checkpoint): the device's
  /// copies are uploaded again before their next use.
  void host_replaced();
  /// Every parameter's host gradient, writable without marking the parameters changed.
  std::vector<std::span<T>> gradients();

  /// Sets every gradient to zero (on `threads` threads). On the host the buffers are only marked
  /// zero: the backward's first GEMM into each overwrites it, and whatever nothing wrote is
  /// cleared before the gradients are next read (forward_backward's end, parameters(),
  /// gradients(), find()).
  void zero_grad(int threads = 1);

  /// Forward and backward of `batch`: adds ∂(Σ token losses)/∂θ into every parameter's gradient
  /// (unnormalised, so micro-batches and data-parallel ranks sum exactly; the trainer divides by
  /// the total token count) and returns the summed loss.
  result<loss_sum> forward_backward(const train_batch& batch);
  /// The same for several shares of micro-batches at once, share j on thread j (each with its own
  /// activations and gradient buffers; BLAS should then run one thread per share): the shares'
  /// gradients are added into the parameters' in share order, so the result depends on the number
  /// of shares but never on timing. One share is forward_backward of each batch in turn.
  result<loss_sum> forward_backward(std::span<const std::vector<train_batch>> shares);

  /// The parameters (indices into parameters()) in the order the host backward finishes their
  /// gradients, in groups: the output norm (with an untied output head), each block from the last
  /// to the first, then the token embedding (with a tied head). Every parameter is in one group.
  std::vector<std::vector<int>> gradient_groups() const;
  /// Told that group `g` of gradient_groups is final for the call: every share has finished it
  /// and the shares' sums are added. Called once per group and call, from the shares' threads
  /// (concurrently, and not necessarily in group order): it must be thread-safe and quick.
  using gradient_ready = std::function<void(size_t g)>;
  /// forward_backward of `shares` (as above) that tells `ready` of each group as soon as its
  /// gradients are final, while the backward goes on with the earlier layers — for a
  /// data-parallel reduction that overlaps the backward (DDP's buckets). The same bits as without
  /// it. A group's gradients may be read and written through gradient_buffers from `ready` on;
  /// the backward no longer touches them. On a device the groups are told when the call returns.
  result<loss_sum> forward_backward(std::span<const std::vector<train_batch>> shares,
                                    const gradient_ready& ready);
  /// Every parameter's host gradient buffer as it is, without clearing what zero_grad only marked
  /// (gradients() does): current only for the groups a gradient_ready was told of, or after a
  /// forward_backward returned.
  std::vector<std::span<T>> gradient_buffers();

  /// Forward and backward of a per-token objective instead of cross-entropy (RL): adds ∂(Σ ℓ)/∂θ
  /// into the gradients and returns Σ ℓ with the number of loss positions.
  result<loss_sum> forward_backward(const train_batch& batch, const token_objective<T>& objective);
  /// The same over parallel shares (as the cross-entropy overload above).
  result<loss_sum> forward_backward(std::span<const std::vector<train_batch>> shares,
                                    const token_objective<T>& objective);
  /// The same, telling `ready` of each gradient group as soon as it is final (as the
  /// cross-entropy overload with `ready` above: an RL trainer group's overlapped all-reduce).
  result<loss_sum> forward_backward(std::span<const std::vector<train_batch>> shares,
                                    const token_objective<T>& objective,
                                    const gradient_ready& ready);

  /// Forward only: log p(target) at every position with a target, in batch order (at the logit
  /// temperature).
  result<std::vector<T>> target_logprobs(const train_batch& batch);

  /// Per-token objectives and target_logprobs see log p = log-softmax(logits / t): the policy a
  /// rollout sampled at temperature t (RL; docs/rl.md). Cross-entropy (SFT) ignores it. t > 0.
  void set_logit_temperature(T t);
  T logit_temperature() const { return logit_temperature_; }

  /// Forward only: the logits of every position, [n_tokens][n_vocab].
  result<std::vector<T>> logits(const train_batch& batch);

  /// Routing replay since the last call (train_batch::routes): (token, layer) pairs whose experts
  /// were given, and those of them whose given experts differ from the router's own top-k (the
  /// train/inference routing mismatch). Resets the counts.
  std::pair<int64_t, int64_t> take_routing_stats();

 private:
  struct layer_params;
  struct layer_acts;
  struct forward_state;
  struct backward_scratch;
  struct replica;
  struct grad_sink;

  trainable_model(const model_hparams& hp, const trainable_config& config);
  /// The host gradients as a grad_sink over grad_fresh_.
  grad_sink own_grads();
  /// Clears the host gradients zero_grad marked that no backward wrote since.
  void settle_grads();
  status check(const train_batch& batch) const;
  void forward(const train_batch& batch, forward_state& fs);
  void layer_forward(int64_t il, const forward_state& fs, const T* x_in, layer_acts& a, T* x_out);
  void layer_backward(int64_t il, const forward_state& fs, backward_scratch& bs, grad_sink& grads,
                      layer_acts& a, T* dx);
  /// MoE feed-forward of a block: y = Σ_j w_j · expert_j(xn2) over the routed experts.
  void moe_forward(const layer_params& l, int64_t il, const forward_state& fs, int64_t n,
                   layer_acts& a, T* y);
  /// Its backward: dy = ∂L/∂y; overwrites dxn with ∂L/∂xn2, adds into the router's and experts'
  /// gradients.
  void moe_backward(const layer_params& l, int64_t n, backward_scratch& bs, grad_sink& grads,
                    const layer_acts& a, const T* dy, T* dxn, const std::vector<T>& balance_grad);
  /// Forward and backward of one checked batch into `grads` (one pointer per parameter).
  /// `on_group` (may be null): told of each gradient group as this batch's backward finishes it
  /// (its buffers settled in `grads` first).
  loss_sum accumulate(const train_batch& b, forward_state& fs, backward_scratch& bs,
                      grad_sink& grads, const token_objective<T>* objective,
                      const std::function<void(size_t)>* on_group = nullptr);
  result<loss_sum> run_shares(std::span<const std::vector<train_batch>> shares,
                              const token_objective<T>* objective,
                              const gradient_ready* ready = nullptr);
  /// Forward and backward of checked batches on device_.
  result<loss_sum> on_device(std::vector<const train_batch*> batches,
                             const token_objective<T>* objective);

  model_hparams hp_;
  trainable_config config_;
  std::vector<parameter<T>> params_;
  std::vector<layer_params> layers_;
  std::vector<float> rope_freqs_;  ///< rope_freqs.weight when the file has it (not trained).
  int embd_ = 0, out_norm_ = 0, output_ = 0;  ///< Indices into params_ (output_ == embd_ if tied).
  int64_t moe_ff_ = 0;                        ///< MoE: the experts' hidden size.
  std::unique_ptr<forward_state> fs_;         ///< Activations, reused from call to call.
  std::unique_ptr<backward_scratch> bs_;      ///< Gradient buffers, reused from call to call.
  std::vector<std::unique_ptr<replica>> replicas_;  ///< Shares 1.. of a parallel call.
  std::unique_ptr<device_trainer> device_;          ///< use_device's, or null.
  T logit_temperature_ = T(1);
  bool params_changed_ = true;
  std::vector<uint8_t> grad_fresh_;  ///< Per parameter: marked zero by zero_grad, not yet cleared.
  int zero_threads_ = 1;             ///< zero_grad's threads, for settle_grads.
};

extern template class trainable_model<float>;
extern template class trainable_model<double>;

}  // namespace weft::gpu::train
