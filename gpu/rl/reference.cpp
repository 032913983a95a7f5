#include "gpu/rl/reference.hpp"

namespace weft::gpu::rl {

namespace {

class local_reference final : public reference_policy {
 public:
  explicit local_reference(std::unique_ptr<train::trainable_model<float>> m)
      : model_(std::move(m)) {}
  result<std::vector<std::vector<float>>> logprobs(
      std::span<const train::train_batch* const> batches) override {
    return reference_logprobs(*model_, batches);
  }

 private:
  std::unique_ptr<train::trainable_model<float>> model_;
};

}  // namespace

result<std::vector<std::vector<float>>> reference_logprobs(
    train::trainable_model<float>& model, std::span<const train::train_batch* const> batches) {
  std::vector<std::vector<float>> out;
  out.reserve(batches.size());
  for (const train::train_batch* b : batches) {
    auto lp = b->routes.empty() ? model.target_logprobs(*b) : [&] {
      train::train_batch unrouted = *b;
      unrouted.routes.clear();
      unrouted.route_width = 0;
      return model.target_logprobs(unrouted);
    }();
    if (!lp) return lp.error();
    out.push_back(std::move(*lp));
  }
  return out;
}

result<std::unique_ptr<reference_policy>> load_local_reference(const gguf_file& source,
                                                               float temperature, device* dev) {
  auto m = train::trainable_model<float>::load(source);
  if (!m) return m.error();
  (*m)->set_logit_temperature(temperature);
  if (dev != nullptr) {
    if (auto st = (*m)->use_device(dev); !st) return st;
  }
  return std::unique_ptr<reference_policy>(new local_reference(std::move(*m)));
}

}  // namespace weft::gpu::rl
