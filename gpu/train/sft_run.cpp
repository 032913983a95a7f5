#include "gpu/train/sft_run.hpp"

#include <cblas.h>
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include <algorithm>

#include "gpu/chat_template.hpp"
#include "gpu/tokenizer.hpp"

namespace weft::gpu::train {

namespace {

status bad(const std::string& what) {
  return {status_code::invalid_argument, "trainer options: " + what};
}

}  // namespace

nlohmann::json to_json(const sft_run_options& o) {
  return {{"model", o.model_path},
          {"data", o.data_path},
          {"eval_data", o.eval_data_path},
          {"eval_every", o.eval_every},
          {"steps", o.steps},
          {"batch_tokens", o.batch_tokens},
          {"micro_batch_tokens", o.micro_batch_tokens},
          {"max_seq_tokens", o.max_seq_tokens},
          {"lr", o.lr},
          {"warmup_steps", o.warmup_steps},
          {"lr_schedule", o.lr_schedule},
          {"min_lr_ratio", o.min_lr_ratio},
          {"weight_decay", o.weight_decay},
          {"beta1", o.beta1},
          {"beta2", o.beta2},
          {"adam_eps", o.adam_eps},
          {"max_grad_norm", o.max_grad_norm},
          {"seed", o.seed},
          {"threads", o.threads},
          {"recompute", o.recompute},
          {"router_aux_loss_coef", o.router_aux_loss_coef},
          {"device", o.device},
          {"offload_optimizer", o.offload_optimizer},
          {"dist_backend", o.dist_backend},
          {"bucket_mb", o.bucket_mb},
          {"checkpoint_dir", o.checkpoint_dir},
          {"checkpoint_every", o.checkpoint_every},
          {"keep_checkpoints", o.keep_checkpoints},
          {"save", o.save_path},
          {"save_type", o.save_type}};
}

result<sft_run_options> sft_run_options_from_json(const nlohmann::json& j) {
  if (!j.is_object()) return bad("expected a JSON object");
  const nlohmann::json defaults = to_json(sft_run_options{});
  for (const auto& [key, value] : j.items()) {
    if (!defaults.contains(key)) return bad("unknown key '" + key + "'");
    const auto& d = defaults[key];
    const bool same_type = (d.is_string() && value.is_string()) ||
                           (d.is_boolean() && value.is_boolean()) ||
                           (d.is_number() && value.is_number());
    if (!same_type) return bad("'" + key + "' has the wrong type");
  }
  sft_run_options o;
  try {
    o.model_path = j.value("model", o.model_path);
    o.data_path = j.value("data", o.data_path);
    o.eval_data_path = j.value("eval_data", o.eval_data_path);
    o.eval_every = j.value("eval_every", o.eval_every);
    o.steps = j.value("steps", o.steps);
    o.batch_tokens = j.value("batch_tokens", o.batch_tokens);
    o.micro_batch_tokens = j.value("micro_batch_tokens", o.micro_batch_tokens);
    o.max_seq_tokens = j.value("max_seq_tokens", o.max_seq_tokens);
    o.lr = j.value("lr", o.lr);
    o.warmup_steps = j.value("warmup_steps", o.warmup_steps);
    o.lr_schedule = j.value("lr_schedule", o.lr_schedule);
    o.min_lr_ratio = j.value("min_lr_ratio", o.min_lr_ratio);
    o.weight_decay = j.value("weight_decay", o.weight_decay);
    o.beta1 = j.value("beta1", o.beta1);
    o.beta2 = j.value("beta2", o.beta2);
    o.adam_eps = j.value("adam_eps", o.adam_eps);
    o.max_grad_norm = j.value("max_grad_norm", o.max_grad_norm);
    o.seed = j.value("seed", o.seed);
    o.threads = j.value("threads", o.threads);
    o.recompute = j.value("recompute", o.recompute);
    o.router_aux_loss_coef = j.value("router_aux_loss_coef", o.router_aux_loss_coef);
    o.device = j.value("device", o.device);
    o.offload_optimizer = j.value("offload_optimizer", o.offload_optimizer);
    o.dist_backend = j.value("dist_backend", o.dist_backend);
    o.bucket_mb = j.value("bucket_mb", o.bucket_mb);
    o.checkpoint_dir = j.value("checkpoint_dir", o.checkpoint_dir);
    o.checkpoint_every = j.value("checkpoint_every", o.checkpoint_every);
    o.keep_checkpoints = j.value("keep_checkpoints", o.keep_checkpoints);
    o.save_path = j.value("save", o.save_path);
    o.save_type = j.value("save_type", o.save_type);
  } catch (const nlohmann::json::exception& e) {
    return bad(e.what());
  }
  if (o.data_path.empty() || o.model_path.empty()) return bad("'model' and 'data' are required");
  if (o.steps < 1 || o.batch_tokens < 1 || o.micro_batch_tokens < 1 || o.max_seq_tokens < 2 ||
      o.warmup_steps < 0 || o.eval_every < 0 || o.checkpoint_every < 1 || o.keep_checkpoints < 1 ||
      o.threads < 1 || o.threads > 1024) {
    return bad("counts out of range");
  }
  if (!(o.lr > 0) || !(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1) || !(o.weight_decay >= 0) ||
      !(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1) || !(o.adam_eps > 0) ||
      !(o.max_grad_norm >= 0) || !(o.bucket_mb >= 0 && o.bucket_mb <= 1e6)) {
    return bad("hyperparameters out of range");
  }
  if (o.dist_backend != "auto" && o.dist_backend != "nccl" && o.dist_backend != "ucx")
    return bad("dist_backend must be auto, nccl or ucx, not '" + o.dist_backend + "'");
  if (o.save_type != "f32" && o.save_type != "f16" && o.save_type != "bf16" &&
      o.save_type != "q8_0") {
    return bad("save_type must be f32, f16, bf16 or q8_0, not '" + o.save_type + "'");
  }
  return o;
}

result<sft_config> make_sft_config(const sft_run_options& o) {
  lr_schedule::shape shape{};
  if (!parse_lr_shape(o.lr_schedule, shape)) return bad("lr_schedule must be cosine or constant");
  sft_config sc;
  sc.seed = o.seed;
  sc.step_tokens = o.batch_tokens;
  sc.micro_batch_tokens = o.micro_batch_tokens;
  sc.schedule.peak = o.lr;
  sc.schedule.warmup_steps = o.warmup_steps;
  sc.schedule.total_steps = o.steps;
  sc.schedule.decay = shape;
  sc.schedule.min_ratio = o.min_lr_ratio;
  sc.adamw = {o.beta1, o.beta2, o.adam_eps, o.weight_decay};
  sc.max_grad_norm = o.max_grad_norm;
  sc.parallel = plan_threads(o.threads).shares;
  sc.adamw.threads = sc.parallel;
  if (o.offload_optimizer && o.device == "cpu")
    return bad(
        "offload_optimizer needs a device (--device cuda): without one the optimizer runs "
        "on the host already");
  if (o.device != "cpu") {
    // Forward and backward run on the device (one share); with the optimizer offloaded the host's
    // cores all go to the element-wise work that stays there: the gradient scaling and AdamW.
    sc.parallel = 1;
    sc.adamw.threads = std::max(1, o.threads);
    sc.offload_optimizer = o.offload_optimizer;
  }
  return sc;
}

result<sft_run> load_sft_run(const sft_run_options& o, bool with_model) {
  auto file = gguf_file::open(o.model_path);
  if (!file) {
    return status{file.error().code(),
                  "cannot open " + o.model_path + ": " + file.error().message()};
  }
  auto tok = tokenizer::from_gguf(*file);
  if (!tok) return status{tok.error().code(), o.model_path + ": " + tok.error().message()};
  auto chat = chat_template::from_gguf(*file);
  sft_data_config dc;
  dc.max_seq_tokens = o.max_seq_tokens;
  auto data = load_sft_jsonl(o.data_path, *tok, chat ? &*chat : nullptr, dc);
  if (!data) return data.error();
  spdlog::info("data: {} examples, {} tokens, {} in the loss, {} cut to {} tokens",
               data->examples.size(), data->tokens, data->loss_tokens, data->truncated,
               o.max_seq_tokens);
  sft_dataset eval_data;
  if (!o.eval_data_path.empty()) {
    auto e = load_sft_jsonl(o.eval_data_path, *tok, chat ? &*chat : nullptr, dc);
    if (!e) return e.error();
    eval_data = std::move(*e);
    spdlog::info("eval data: {} examples, {} tokens in the loss", eval_data.examples.size(),
                 eval_data.loss_tokens);
  }
  std::unique_ptr<trainable_model<float>> model;
  std::unique_ptr<device> dev;
  if (with_model) {
    auto d = open_training_device(o.device);
    if (!d) return d.error();
    dev = std::move(*d);
    trainable_config tc;
    tc.recompute = o.recompute;
    tc.router_aux_loss_coef = o.router_aux_loss_coef;
    auto m = trainable_model<float>::load(*file, tc);
    if (!m) return status{m.error().code(), o.model_path + ": " + m.error().message()};
    model = std::move(*m);
    spdlog::info(
        "model: {} parameters in f32 ({:.1f} MiB; with gradients and AdamW moments {:.1f} MiB)",
        model->n_parameters(), model->n_parameters() * 4.0 / (1 << 20),
        model->n_parameters() * 16.0 / (1 << 20));
    if (dev) {
      if (auto st = model->use_device(dev.get()); !st)
        return status{st.code(), "--device " + o.device + ": " + st.message()};
      if (o.offload_optimizer)
        spdlog::info(
            "forward and backward on {}; master weights and AdamW on the host "
            "(--offload-optimizer)",
            dev->capabilities().name);
      else
        spdlog::info("training on {}: weights, gradients and AdamW in device memory",
                     dev->capabilities().name);
    }
  }
  return sft_run{std::move(*file), std::move(*data), std::move(eval_data), std::move(dev),
                 std::move(model)};
}

std::string device_for_local_rank(const std::string& device, int local_rank, int devices) {
  if (device == "cpu" || device.find(':') != std::string::npos || devices <= 0) return device;
  return device + ":" + std::to_string(std::max(0, local_rank) % devices);
}

result<std::unique_ptr<device>> open_training_device(const std::string& name) {
  if (name == "cpu") return std::unique_ptr<device>{};
  auto d = device_registry::instance().open(name);
  if (!d) return status{d.error().code(), "--device " + name + ": " + d.error().message()};
  return std::move(*d);
}

thread_plan plan_threads(int threads) {
  thread_plan p;
  threads = std::max(1, threads);
  p.shares = std::min(threads, 4);
  p.blas = std::max(1, threads / p.shares);
  return p;
}

void use_threads(const sft_run_options& o) {
  use_threads(o.threads);
}

void use_threads(int threads) {
  openblas_set_num_threads(plan_threads(threads).blas);
}

}  // namespace weft::gpu::train
