/// trainable_model's device attachment (docs/training.md, "The model on a device"): use_device,
/// device-resident training (the optimizer step on the device, the gradients' copies and the
/// device's own gradient buffers for an in-place all-reduce) and keeping the host copy current.
/// The forward and backward on the device are device_trainer's.

#include <type_traits>

#include "gpu/train/device_trainer.hpp"
#include "gpu/train/trainable_model.hpp"
#include "gpu/train/trainable_model_state.hpp"

namespace weft::gpu::train {

template <class T>
status trainable_model<T>::use_device(device* dev) {
  if (!host_current())
    return {status_code::internal,
            "the device holds newer weights than the host: pull_to_host before detaching it"};
  if (dev == nullptr) {
    device_.reset();
    return {};
  }
  if constexpr (!std::is_same_v<T, float>) {
    return {status_code::unsupported, "a device runs the f32 trainer only"};
  } else {
    if (dev->training() == nullptr)
      return {status_code::unsupported,
              dev->capabilities().name + " has no trainer ops (device::training)"};
    trainable_layout layout;
    for (const layer_params& l : layers_) {
      layout.layers.push_back(
          {l.attn_norm, l.wq, l.wk, l.wv, l.wo, l.ffn_norm, l.gate, l.up, l.down});
      if (l.router >= 0) layout.moe.push_back({l.router, l.gate_exps, l.up_exps, l.down_exps});
    }
    layout.moe_ff = moe_ff_;
    layout.embd = embd_;
    layout.out_norm = out_norm_;
    layout.output = output_;
    layout.rope_freqs = rope_freqs_;
    device_ = std::make_unique<device_trainer>(*dev, hp_, config_, std::move(layout));
    device_->set_logit_temperature(static_cast<float>(logit_temperature_));
    params_changed_ = true;
    return {};
  }
}

template <class T>
device* trainable_model<T>::compute_device() const {
  return device_ ? &device_->dev() : nullptr;
}

template <class T>
status trainable_model<T>::set_device_resident(bool on) {
  if (!device_) {
    if (!on) return {};
    return {status_code::invalid_argument, "device-resident training needs a device (use_device)"};
  }
  if (!on && (device_->values_newer() || device_->moments_newer()))
    return {status_code::internal,
            "leaving device-resident training with newer weights on the device (pull_to_host)"};
  device_->set_resident(on);
  return {};
}

template <class T>
bool trainable_model<T>::device_resident() const {
  return device_ && device_->resident();
}

template <class T>
result<double> trainable_model<T>::device_step(adamw& opt, std::span<const uint8_t> decay,
                                               float grad_scale, double max_norm, double lr,
                                               int64_t step) {
  if constexpr (!std::is_same_v<T, float>) {
    return status{status_code::unsupported, "a device runs the f32 trainer only"};
  } else {
    if (!device_resident())
      return status{status_code::internal, "device_step needs device-resident training"};
    if (auto st = device_->prepare(params_, params_changed_); !st) return st;
    params_changed_ = false;
    return device_->optimizer_step(opt, decay, grad_scale, max_norm, lr, step);
  }
}

template <class T>
status trainable_model<T>::pull_gradients() {
  if constexpr (std::is_same_v<T, float>) {
    if (device_resident()) {
      // A rank without a micro-batch this step has zero gradients, not the last step's.
      if (auto st = device_->prepare(params_, params_changed_); !st) return st;
      params_changed_ = false;
      return device_->pull_gradients(params_);
    }
  }
  return {status_code::internal, "pull_gradients needs device-resident training"};
}

template <class T>
status trainable_model<T>::push_gradients() {
  if constexpr (std::is_same_v<T, float>) {
    if (device_resident()) return device_->push_gradients(params_);
  }
  return {status_code::internal, "push_gradients needs device-resident training"};
}

template <class T>
result<std::vector<std::span<float>>> trainable_model<T>::device_gradients() {
  if constexpr (std::is_same_v<T, float>) {
    if (device_resident()) {
      auto g = device_->gradient_buffers(params_, params_changed_);
      if (g) params_changed_ = false;
      return g;
    }
  }
  return status{status_code::internal, "device_gradients needs device-resident training"};
}

template <class T>
status trainable_model<T>::pull_to_host(adamw* opt) {
  if constexpr (std::is_same_v<T, float>) {
    if (!device_) return {};
    if (auto st = device_->pull_values(params_); !st) return st;
    if (opt != nullptr) return device_->pull_moments(*opt);
  }
  return {};
}

template <class T>
bool trainable_model<T>::host_current() const {
  return !device_ || !device_->values_newer();
}

template <class T>
void trainable_model<T>::host_replaced() {
  params_changed_ = true;
  if (device_) device_->host_replaced();
}

#define WEFT_DEVICE_MEMBERS(T)                                                                     \
  template status trainable_model<T>::use_device(device*);                                         \
  template device* trainable_model<T>::compute_device() const;                                     \
  template status trainable_model<T>::set_device_resident(bool);                                   \
  template bool trainable_model<T>::device_resident() const;                                       \
  template result<double> trainable_model<T>::device_step(adamw&, std::span<const uint8_t>, float, \
                                                          double, double, int64_t);                \
  template status trainable_model<T>::pull_gradients();                                            \
  template status trainable_model<T>::push_gradients();                                            \
  template result<std::vector<std::span<float>>> trainable_model<T>::device_gradients();           \
  template status trainable_model<T>::pull_to_host(adamw*);                                        \
  template bool trainable_model<T>::host_current() const;                                          \
  template void trainable_model<T>::host_replaced();
WEFT_DEVICE_MEMBERS(float)
WEFT_DEVICE_MEMBERS(double)
#undef WEFT_DEVICE_MEMBERS

}  // namespace weft::gpu::train
