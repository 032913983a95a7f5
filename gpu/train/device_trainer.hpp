#pragma once
/// The trainable model's forward and backward on a device (internal to trainable_model; see
/// trainable_model::use_device and docs/training.md). The host keeps the master parameters and the
/// optimizer (as DeepSpeed's ZeRO-Offload): parameters are uploaded when they changed, every op of
/// the forward and backward runs on the device through device::training() and device::ops(), and
/// the gradients are added into the host gradients when a call returns. f32 only.
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/model.hpp"
#include "gpu/status.hpp"
#include "gpu/train/train_ops.hpp"
#include "gpu/train/trainable_model.hpp"

namespace weft::gpu::train {

/// Where each weight of the model is in the parameter list.
struct trainable_layout {
  /// Per block: attn_norm, wq, wk, wv, wo, ffn_norm, gate, up, down.
  std::vector<std::array<int, 9>> layers;
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

 private:
  struct state;
  status upload(const std::vector<parameter<float>>& params);
  status forward(const train_batch& b);
  status layer_forward(int64_t il, const float* x_in, int acts, float* x_out);
  status layer_backward(int64_t il, int acts, const float* x_in, float* dx);
  status accumulate(const train_batch& b, const token_objective<float>* objective, loss_sum& loss);

  device& dev_;
  model_hparams hp_;
  bool recompute_ = false;
  int64_t head_chunk_rows_ = 256;
  trainable_layout layout_;
  std::unique_ptr<state> s_;
};

}  // namespace weft::gpu::train
