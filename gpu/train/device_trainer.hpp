#pragma once
/// The trainable model's forward and backward on a device (internal to trainable_model; see
/// trainable_model::use_device and docs/training.md). The host keeps the master parameters and the
/// optimizer (as DeepSpeed's ZeRO-Offload): parameters are uploaded when they changed, every op of
/// the forward and backward runs on the device through device::training() and device::ops(), and
/// the gradients are added into the host gradients when a call returns. f32 only. In resident mode
/// the gradients stay on the device and the optimizer update runs there too (optimizer_step),
/// with its moments in device memory; the host copies are brought up to date when asked.
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/model.hpp"
#include "gpu/status.hpp"
#include "gpu/train/optimizer.hpp"
#include "gpu/train/train_ops.hpp"
#include "gpu/train/trainable_model.hpp"

namespace weft::gpu::train {

/// Where each weight of the model is in the parameter list.
struct trainable_layout {
  /// Per block: attn_norm, wq, wk, wv, wo, ffn_norm, gate, up, down (−1 for an MoE block's
  /// gate, up, down).
  std::vector<std::array<int, 9>> layers;
  /// MoE only, per block: router, gate_exps, up_exps, down_exps; and the experts' hidden size.
  std::vector<std::array<int, 4>> moe;
  int64_t moe_ff = 0;
  int embd = 0, out_norm = 0, output = 0;
  std::vector<float> rope_freqs;
};

class device_trainer {
 public:
  device_trainer(device& dev, const model_hparams& hp, const trainable_config& config,
                 trainable_layout layout);
  ~device_trainer();
  device_trainer(const device_trainer&) = delete;
  device_trainer& operator=(const device_trainer&) = delete;

  device& dev() { return dev_; }
  /// Forward and backward of each batch in turn, gradients summed on the device, then added into
  /// the parameters' host gradients. `params` are uploaded first when `upload` is set. `objective`
  /// null: cross-entropy.
  result<loss_sum> forward_backward(std::span<const train_batch* const> batches,
                                    const token_objective<float>* objective,
                                    std::vector<parameter<float>>& params, bool upload);
  /// Forward only: the logits of every position, [n_tokens][n_vocab], on the host.
  result<std::vector<float>> logits(const train_batch& batch,
                                    const std::vector<parameter<float>>& params, bool upload);

  /// trainable_model::take_routing_stats's counts of this device's forward passes (reset).
  std::pair<int64_t, int64_t> take_routing_stats();

  /// Per-token objectives see log-softmax(logits / t) (trainable_model::set_logit_temperature).
  void set_logit_temperature(float t) { logit_temperature_ = t; }

  // Device-resident training (trainable_model::set_device_resident).
  /// On: forward_backward leaves the gradients on the device, added to what is there since the
  /// last zero_grads.
  void set_resident(bool on) { resident_ = on; }
  bool resident() const { return resident_; }
  /// The next forward_backward starts from zero gradients.
  void zero_grads() { zero_pending_ = true; }
  /// Overwrites the host gradients with the device's, or the device's with the host's.
  status pull_gradients(std::vector<parameter<float>>& params);
  status push_gradients(const std::vector<parameter<float>>& params);
  /// The device's gradient buffers, one per parameter, after prepare(params, upload) and with the
  /// device's queued work finished (another engine may read and write them, e.g. NCCL).
  result<std::vector<std::span<float>>> gradient_buffers(std::vector<parameter<float>>& params,
                                                         bool upload);
  /// Brings the device's state to where a forward_backward starts: `params` uploaded when
  /// `upload` is set or nothing is there yet, the gradients zeroed when a zero_grads (or the
  /// offloaded split) asks for it. An update without any forward_backward since zero_grads (RL: a
  /// step where no sample is in the loss) then steps with zero gradients, as the host does.
  status prepare(std::vector<parameter<float>>& params, bool upload);
  /// One optimizer update on the device (trainable_model::device_step).
  result<double> optimizer_step(adamw& opt, std::span<const uint8_t> decay, float grad_scale,
                                double max_norm, double lr, int64_t step);
  /// Whether the device's parameters (moments) are newer than the host's.
  bool values_newer() const { return values_newer_; }
  bool moments_newer() const { return moments_newer_; }
  status pull_values(std::vector<parameter<float>>& params);
  status pull_moments(adamw& opt);
  /// The host's parameters and moments replaced the device's (a restored checkpoint): the device
  /// copies are uploaded again before their next use.
  void host_replaced() {
    values_newer_ = false;
    moments_newer_ = false;
    moments_on_device_ = false;
  }

 private:
  struct state;
  status upload(const std::vector<parameter<float>>& params);
  status forward(const train_batch& b);
  status layer_forward(int64_t il, const float* x_in, int acts, float* x_out);
  status layer_backward(int64_t il, int acts, const float* x_in, float* dx);
  /// The MoE feed-forward of block il on activations `acts` (routing on the host) and its
  /// backward (dy = ∂L/∂y; dxn overwritten with ∂L/∂xn2), as trainable_model's.
  status moe_forward(int64_t il, int acts, float* y);
  status moe_backward(int64_t il, int acts, const float* dy, float* dxn);
  status accumulate(const train_batch& b, const token_objective<float>* objective, loss_sum& loss);

  device& dev_;
  model_hparams hp_;
  bool recompute_ = false;
  int64_t head_chunk_rows_ = 256;
  double router_aux_loss_coef_ = 0.0;
  trainable_layout layout_;
  std::unique_ptr<state> s_;
  bool resident_ = false;
  float logit_temperature_ = 1.0f;
  bool zero_pending_ = true;
  bool values_newer_ = false;       ///< An update ran on the device since the last pull_values.
  bool moments_newer_ = false;      ///< ... since the last pull_moments.
  bool moments_on_device_ = false;  ///< The device holds the optimizer's moments.
};

}  // namespace weft::gpu::train
