// Trainer benchmark (docs/training.md): tokens/s of one training step (forward, backward, AdamW)
// on a GGUF model with a fixed packed batch, the share of the compute ceiling (this host's measured
// SGEMM peak; a step costs ~6 FLOPs per parameter per token plus attention), and the checkpoint
// save time and the stall an asynchronous save causes. The PyTorch baseline of the same batch runs
// in bench/e2e/train_vs_pytorch.py, which calls this binary in the same run.
//
//   train_bench --model M.gguf [--seq-tokens 256] [--seqs 4] [--steps 5] [--threads T] [--json F]
//               [--device cpu|cuda|cuda:N] [--offload-optimizer 0|1]
//
// --device: the step on that device, as `weft train --device` runs it: forward, backward, the
// gradient scaling and AdamW in device memory (trainable_model::set_device_resident), or with
// --offload-optimizer 1 the weights and AdamW on the host (ZeRO-Offload). The SGEMM ceiling is the
// host's and is only reported for the CPU.
#include <cblas.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gpu/cpu/blas_kernels.hpp"
#include "gpu/gguf.hpp"
#include "gpu/train/checkpoint.hpp"
#include "gpu/train/optimizer.hpp"
#include "gpu/train/sft_run.hpp"
#include "gpu/train/trainable_model.hpp"

namespace {

using namespace weft::gpu;
using namespace weft::gpu::train;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

/// Best of three 1024³ SGEMMs, in FLOP/s.
double sgemm_peak() {
  const int n = 1024;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = clock_type::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    best = std::max(best, 2.0 * n * n * n / seconds_since(t0));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  weft::gpu::cpu::select_blas_kernels(argv);
  std::string model_path, json_path;
  int64_t seq_tokens = 256, seqs = 4, steps = 5;
  int threads = 0;
  std::string mode = "plan";
  std::string device_name = "cpu";
  bool offload = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--model")
      model_path = v;
    else if (k == "--seq-tokens")
      seq_tokens = std::atoll(v);
    else if (k == "--seqs")
      seqs = std::atoll(v);
    else if (k == "--steps")
      steps = std::atoll(v);
    else if (k == "--threads")
      threads = std::atoi(v);
    else if (k == "--json")
      json_path = v;
    else if (k == "--mode")
      mode = v;
    else if (k == "--device")
      device_name = v;
    else if (k == "--offload-optimizer")
      offload = std::atoi(v) != 0;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (model_path.empty()) {
    std::fprintf(stderr,
                 "usage: train_bench --model M.gguf [--seq-tokens N] [--seqs S] [--steps K] "
                 "[--threads T] [--mode plan|blas] [--json F] [--device cpu|cuda] "
                 "[--offload-optimizer 0|1]\n");
    return 2;
  }
  // plan: as `weft train --threads T` runs (plan_threads: shares of the batch in parallel, one
  // thread each, the rest BLAS threads); blas: one share, T BLAS threads.
  if (threads <= 0) threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  thread_plan plan = plan_threads(threads);
  if (mode == "blas") plan = {1, threads};
  openblas_set_num_threads(plan.blas);
  // The device first: it must outlive the model, which releases its buffers on it.
  auto dev = open_training_device(device_name);
  if (!dev) {
    std::fprintf(stderr, "%s\n", dev.error().to_string().c_str());
    return 1;
  }
  auto file = gguf_file::open(model_path);
  if (!file) {
    std::fprintf(stderr, "%s\n", file.error().to_string().c_str());
    return 1;
  }
  auto model = trainable_model<float>::load(*file);
  if (!model) {
    std::fprintf(stderr, "%s\n", model.error().to_string().c_str());
    return 1;
  }
  auto& m = **model;
  const bool on_cpu = *dev == nullptr;
  if (!on_cpu) {
    if (auto st = m.use_device(dev->get()); !st) {
      std::fprintf(stderr, "%s\n", st.to_string().c_str());
      return 1;
    }
    plan.shares = 1;  // one device: the shares would run one after the other anyway
    if (auto st = m.set_device_resident(!offload); !st) {
      std::fprintf(stderr, "%s\n", st.to_string().c_str());
      return 1;
    }
  }
  const bool resident = m.device_resident();
  // The batch: `seqs` sequences of random tokens, every position in the loss (seed 1; the PyTorch
  // script draws the same ids from the same generator output, written to the JSON).
  std::mt19937 rng(1);
  train_batch batch;
  std::vector<std::vector<train_batch>> shares(static_cast<size_t>(plan.shares),
                                               std::vector<train_batch>(1));
  std::vector<std::vector<int32_t>> all;
  for (int64_t s = 0; s < seqs; ++s) {
    std::vector<int32_t> ids(static_cast<size_t>(seq_tokens));
    for (auto& t : ids)
      t = static_cast<int32_t>(rng() % static_cast<uint32_t>(m.hparams().n_vocab));
    batch.add(ids, std::vector<uint8_t>(ids.size(), 1));
    shares[static_cast<size_t>(s % plan.shares)][0].add(ids, std::vector<uint8_t>(ids.size(), 1));
    all.push_back(ids);
  }
  adamw_config ac;
  ac.threads = on_cpu ? plan.shares : threads;  // as sft_trainer runs it (make_sft_config)
  adamw opt(ac);
  std::vector<int64_t> sizes;
  std::vector<uint8_t> decay;
  for (const auto& p : std::as_const(m).parameters()) {
    sizes.push_back(p.size());
    decay.push_back(p.ne[1] > 1 ? 1 : 0);
  }
  opt.init(sizes);
  std::vector<double> step_s;
  for (int64_t i = 0; i < steps + 1; ++i) {  // the first step warms up and is not counted
    const auto t0 = clock_type::now();
    m.zero_grad(ac.threads);
    auto l = plan.shares == 1
                 ? m.forward_backward(batch)
                 : m.forward_backward(std::span<const std::vector<train_batch>>(shares));
    if (!l) {
      std::fprintf(stderr, "%s\n", l.error().to_string().c_str());
      return 1;
    }
    if (resident) {
      // As sft_trainer's device-resident step (no clipping here, as on the host path below).
      auto norm = m.device_step(opt, decay, 1.0f / static_cast<float>(l->tokens), 0.0, 1e-5, i + 1);
      if (auto st = norm ? (*dev)->synchronize() : norm.error(); !st) {
        std::fprintf(stderr, "%s\n", st.to_string().c_str());
        return 1;
      }
      if (i > 0) step_s.push_back(seconds_since(t0));
      continue;
    }
    // As sft_trainer's host update: the mean's scale applied as the update reads the sums.
    std::vector<std::span<float>> values;
    std::vector<std::span<const float>> grads;
    for (auto& p : m.parameters()) {
      values.emplace_back(p.value);
      grads.emplace_back(p.grad.data(), p.grad.size());
    }
    auto norm = scale_clip_and_update(opt, values, grads, decay,
                                      1.0f / static_cast<float>(l->tokens), 0.0, 1e-5, i + 1);
    if (!norm) {
      std::fprintf(stderr, "%s\n", norm.error().to_string().c_str());
      return 1;
    }
    if (i > 0) step_s.push_back(seconds_since(t0));
  }
  std::sort(step_s.begin(), step_s.end());
  const double median = step_s[step_s.size() / 2];
  const double tokens = static_cast<double>(batch.n_tokens());
  const auto& hp = m.hparams();
  // FLOPs of a step: 6 per matmul weight per token (forward 2, backward 4) — the embedding is a
  // lookup, the head a matmul (the same tensor when tied) — plus causal attention (QKᵀ and PV:
  // 2·2·L²/2·d per layer forward, ×3 with the backward). An MoE token runs k of its experts.
  double matmul_params = static_cast<double>(m.n_parameters()) -
                         (hp.tied_output ? 0.0 : static_cast<double>(hp.n_vocab * hp.n_embd));
  if (hp.n_experts > 0) {
    for (const auto& p : m.parameters()) {
      if (p.name.find("_exps.") != std::string::npos)
        matmul_params -= static_cast<double>(p.size()) *
                         (1.0 - static_cast<double>(hp.n_experts_used) / hp.n_experts);
    }
  }
  const double attn = 3.0 * 2.0 * static_cast<double>(hp.n_layers) *
                      static_cast<double>(seqs * seq_tokens * seq_tokens) *
                      static_cast<double>(hp.n_heads * hp.head_dim);
  const double flops = 6.0 * matmul_params * tokens + attn;
  // The ceiling is this host's SGEMM peak on all `threads` cores, whatever the plan.
  openblas_set_num_threads(threads);
  const double peak = sgemm_peak();
  openblas_set_num_threads(plan.blas);

  // Checkpoint: a synchronous save, and the stall of an asynchronous one (snapshot only).
  double pull_s = 0;  // Device-resident: bringing the host copy up to date first.
  if (resident) {
    const auto tp = clock_type::now();
    if (auto s = m.pull_to_host(&opt); !s) {
      std::fprintf(stderr, "%s\n", s.to_string().c_str());
      return 1;
    }
    pull_s = seconds_since(tp);
  }
  const auto dir = std::filesystem::temp_directory_path() / "weft_train_bench_ckpt";
  std::filesystem::remove_all(dir);
  checkpoint_state st;
  st.step = 1;
  for (size_t i = 0; i < m.parameters().size(); ++i) {
    st.names.push_back(m.parameters()[i].name);
    st.values.push_back(m.parameters()[i].value);
    st.m.push_back(opt.m(i));
    st.v.push_back(opt.v(i));
  }
  auto t0 = clock_type::now();
  if (auto s = write_checkpoint(dir, st); !s) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    return 1;
  }
  const double sync_save = seconds_since(t0);
  // The async checkpointer's steady state: the second save into its reused staging buffer stalls
  // the trainer for the copy only (the first allocates the buffer).
  double async_stall = 0, async_total = 0;
  {
    async_checkpointer w(dir, 1);
    auto fill = [&](checkpoint_state& s) {
      s.step += 1;
      s.names = st.names;
      s.values.resize(st.values.size());
      s.m.resize(st.m.size());
      s.v.resize(st.v.size());
      for (size_t i = 0; i < st.values.size(); ++i) {
        s.values[i].assign(st.values[i].begin(), st.values[i].end());
        s.m[i].assign(st.m[i].begin(), st.m[i].end());
        s.v[i].assign(st.v[i].begin(), st.v[i].end());
      }
      return status{};
    };
    (void)w.save(fill);
    (void)w.wait();
    t0 = clock_type::now();
    (void)w.save(fill);
    async_stall = seconds_since(t0);
    (void)w.wait();
    async_total = seconds_since(t0);
  }
  std::filesystem::remove_all(dir);

  nlohmann::json out{{"model", model_path},
                     {"parameters", m.n_parameters()},
                     {"threads", threads},
                     {"mode", mode},
                     {"shares", plan.shares},
                     {"blas_threads", plan.blas},
                     {"batch_tokens", batch.n_tokens()},
                     {"seqs", seqs},
                     {"seq_tokens", seq_tokens},
                     {"step_s_median", median},
                     {"step_s", step_s},
                     {"tokens_per_s", tokens / median},
                     {"step_gflop", flops / 1e9},
                     {"device", on_cpu ? std::string{"cpu"} : (*dev)->capabilities().name},
                     {"optimizer", on_cpu ? "host" : (resident ? "device" : "host (offloaded)")},
                     {"pull_to_host_s", pull_s},
                     {"sgemm_peak_gflops", peak / 1e9},
                     {"ceiling_share", on_cpu ? flops / median / peak : 0.0},
                     {"achieved_gflops", flops / median / 1e9},
                     {"checkpoint_bytes", static_cast<double>(m.n_parameters()) * 12.0},
                     {"checkpoint_sync_s", sync_save},
                     {"checkpoint_async_stall_s", async_stall},
                     {"checkpoint_async_total_s", async_total},
                     {"batch", all}};
  if (on_cpu) {
    std::printf(
        "weft train step: %.0f tok/s (median of %lld steps, %.3f s/step), %.1f GFLOP/step, "
        "%.1f%% of the %.1f GFLOP/s SGEMM peak; checkpoint sync %.2f s, async stall %.3f s\n",
        tokens / median, static_cast<long long>(steps), median, flops / 1e9,
        100.0 * flops / median / peak, peak / 1e9, sync_save, async_stall);
  } else {
    std::printf(
        "weft train step on %s (AdamW %s): %.0f tok/s (median of %lld steps, %.3f s/step), %.1f "
        "GFLOP/step = %.0f GFLOP/s; pull to host %.2f s, checkpoint sync %.2f s, async stall "
        "%.3f s\n",
        (*dev)->capabilities().name.c_str(), resident ? "on the device" : "on the host",
        tokens / median, static_cast<long long>(steps), median, flops / 1e9, flops / median / 1e9,
        pull_s, sync_save, async_stall);
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(1);
  return 0;
}
