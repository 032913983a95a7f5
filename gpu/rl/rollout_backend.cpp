#include "gpu/rl/rollout_backend.hpp"

#include <algorithm>
#include <utility>

#include "gpu/train/export.hpp"

namespace weft::gpu::rl {

engine_config rollout_engine_config(const model& m, const rollout_engine_params& p) {
  engine_config ec;
  ec.max_running = p.max_running > 0 ? std::min(p.max_running, p.max_sequences) : p.max_sequences;
  if (p.priority) ec.policy = std::make_shared<priority_policy>();
  ec.max_batch_tokens = 512;
  ec.block_size = 16;
  // A continuation after a tool call replays the turns before it (decode numerics) and takes
  // their cached blocks: exact, whatever the cache holds.
  ec.prefix_into_replay = true;
  // Whole blocks only: a partial block's rows come from whichever sample filled it first, and f32
  // prefill through OpenBLAS is not chunk-invariant, so reuse inside a block would make the
  // rollouts depend on admission timing (a resumed run, a rerun with another reward transport).
  ec.prefix_partial = false;
  // Room for every sample at once (a prompt of ~128 tokens and the completion; the group's
  // samples share their prompt's full blocks), within 1 GiB of KV; beyond that the engine queues
  // or swaps samples. Never less than the longest single request.
  const kv_layout layout = m.kv_layout_for(ec.block_size);
  const int64_t block_bytes = static_cast<int64_t>(layout.block_bytes()) * layout.n_layers * 2;
  const int64_t per_sample = (128 + p.max_new_tokens) / ec.block_size + 2;
  const int64_t longest = (max_rollout_prompt_tokens + p.max_new_tokens) / ec.block_size + 2;
  ec.kv_blocks =
      std::max(longest, std::min(p.max_sequences * per_sample,
                                 (int64_t{1} << 30) / std::max<int64_t>(1, block_bytes)));
  // Routing replay: a prefix-cache hit brings the routes stored beside the cached blocks.
  ec.record_routes = p.record_routes;
  return ec;
}

result<std::unique_ptr<model>> load_rollout_model(const gguf_file& source,
                                                  const train::trainable_model<float>& weights,
                                                  const rollout_engine_params& p, device& dev) {
  if (!is_rollout_weight_type(p.weight_type)) {
    return status{status_code::invalid_argument,
                  std::string{"the rollout weight type must be "} + rollout_weight_types};
  }
  auto image = train::export_gguf_bytes(source, weights, p.weight_type);
  if (!image) return image.error();
  auto file = gguf_file::parse(*image);
  if (!file) return file.error();
  image->clear();
  image->shrink_to_fit();
  model_load_config mc;
  mc.max_batch_tokens = 512;
  mc.record_expert_ids = p.record_routes;
  auto m = model::load(std::move(*file), dev, mc);
  if (!m) {
    return status{m.error().code(), "rollout engine on " + p.device + " with " +
                                        std::string(type_name(p.weight_type)) +
                                        " weights: " + m.error().message()};
  }
  return m;
}

bool is_rollout_weight_type(ggml_type t) {
  return t == ggml_type::f32 || t == ggml_type::bf16 || t == ggml_type::f16 || t == ggml_type::q8_0;
}

status apply_weights(model& m, engine& e, int64_t version, std::span<const named_weights> tensors) {
  for (const auto& t : tensors) {
    if (auto st = m.set_weight(t.name, t.values); !st) return st;
  }
  e.kv().set_prefix_namespace(static_cast<uint64_t>(version));
  return {};
}

result<std::unique_ptr<local_rollout_backend>> local_rollout_backend::create(
    const gguf_file& source, const train::trainable_model<float>& weights,
    const rollout_engine_params& p, std::function<std::string(int32_t)> detokenize) {
  std::unique_ptr<local_rollout_backend> b(new local_rollout_backend());
  auto dev = device_registry::instance().open(p.device, p.threads);
  if (!dev) return status{dev.error().code(), "rollout engine: " + dev.error().message()};
  b->dev_ = std::move(*dev);
  auto m = load_rollout_model(source, weights, p, *b->dev_);
  if (!m) return m.error();
  b->model_ = std::move(*m);
  engine_config ec = rollout_engine_config(*b->model_, p);
  ec.detokenize = std::move(detokenize);
  auto e = engine::create(*b->model_, ec);
  if (!e) return e.error();
  b->engine_ = std::move(*e);
  return b;
}

status local_rollout_backend::add(std::vector<rollout_request> requests) {
  for (auto& r : requests) {
    status st = r.n_replay > 0
                    ? engine_->add_resumed_request(r.id, std::move(r.prompt), r.n_replay, r.params)
                    : engine_->add_request(r.id, std::move(r.prompt), r.params);
    if (!st) return st;
  }
  return {};
}

status local_rollout_backend::abort(request_id id) {
  return engine_->abort(id);
}

result<std::vector<rollout_output>> local_rollout_backend::poll() {
  auto outputs = engine_->step();
  if (!outputs) return outputs.error();
  std::vector<rollout_output> out;
  out.reserve(outputs->size());
  for (auto& o : *outputs) out.push_back(rollout_output{std::move(o), version_});
  return out;
}

bool local_rollout_backend::has_work() const {
  return engine_->has_work();
}

status local_rollout_backend::publish(int64_t version, std::span<const named_weights> tensors) {
  if (auto st = apply_weights(*model_, *engine_, version, tensors); !st) return st;
  version_ = version;
  return {};
}

}  // namespace weft::gpu::rl
