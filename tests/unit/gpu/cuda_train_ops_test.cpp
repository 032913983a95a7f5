// The trainer's ops on the CUDA device against the CPU device (train_ops<float>, the reference that
// the gradient oracle checks against PyTorch): the same random inputs through each op of
// gpu/train/train_kernels.hpp on both devices. Skipped (never passed) where no GPU can be opened.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "device_pair.hpp"
#include "gpu/rl/grpo_loop.hpp"
#include "gpu/train/train_kernels.hpp"
#include "gpu/train/train_ops.hpp"
#include "rl_test_support.hpp"
#include "train_device_check.hpp"
#include "transport/device_group.hpp"
#include "transport/peer_group.hpp"
#include "transport/registry.hpp"

namespace {

using namespace weft::gpu;
using namespace weft::gpu::testing;
using weft::gpu::train::attention_shape;
using weft::gpu::train::device_sequences;
using weft::gpu::train::packed_sequences;

#define WEFT_BOTH_TRAINERS                       \
  WEFT_BOTH_DEVICES;                             \
  ASSERT_NE(cpu.d->training(), nullptr);         \
  ASSERT_NE(gpu.d->training(), nullptr);         \
  train::train_kernels& tc = *cpu.d->training(); \
  train::train_kernels& tg = *gpu.d->training()

TEST(cuda_vs_cpu_train, linear_forward_and_backward) {
  WEFT_BOTH_TRAINERS;
  const int64_t n = 37, in = 96, out = 160;
  const auto x = randn(static_cast<size_t>(n * in), 1), w = randn(static_cast<size_t>(out * in), 2),
             dy = randn(static_cast<size_t>(n * out), 3),
             dx0 = randn(static_cast<size_t>(n * in), 4),
             dw0 = randn(static_cast<size_t>(out * in), 5);
  struct outs {
    std::vector<float> y, dx, dw;
  };
  auto run = [&](dev_ctx& c, train::train_kernels& k) {
    float* y = c.zeros(static_cast<size_t>(n * out));
    float* dx = c.up(dx0);
    float* dw = c.up(dw0);
    EXPECT_TRUE(k.linear_forward(c.up(x), c.up(w), n, in, out, y).ok());
    EXPECT_TRUE(k.linear_backward(c.up(x), c.up(w), c.up(dy), n, in, out, dx, dw, true).ok());
    return outs{c.down(y, static_cast<size_t>(n * out)), c.down(dx, dx0.size()),
                c.down(dw, dw0.size())};
  };
  const outs a = run(cpu, tc), b = run(gpu, tg);
  expect_close("linear forward", a.y, b.y, 1e-5);
  expect_close("linear dx (added)", a.dx, b.dx, 1e-5);
  expect_close("linear dw (accumulated)", a.dw, b.dw, 1e-5);
}

TEST(cuda_vs_cpu_train, rms_norm_swiglu_rope_forward_and_backward) {
  WEFT_BOTH_TRAINERS;
  const int64_t n = 9, d = 192, heads = 3, hd = 64;
  const size_t sz = static_cast<size_t>(n * d);
  const auto x = randn(sz, 6, 2.0f), g = randn(static_cast<size_t>(d), 7), dy = randn(sz, 8),
             u = randn(sz, 9), dx0 = randn(sz, 10), dg0 = randn(static_cast<size_t>(d), 11);
  {
    auto run = [&](dev_ctx& c, train::train_kernels& k) {
      float* y = c.zeros(sz);
      float* rstd = c.zeros(static_cast<size_t>(n));
      float* dx = c.up(dx0);
      float* dg = c.up(dg0);
      EXPECT_TRUE(k.rms_norm_forward(c.up(x), c.up(g), n, d, 1e-5f, y, rstd).ok());
      EXPECT_TRUE(k.rms_norm_backward(c.up(x), c.up(g), rstd, c.up(dy), n, d, dx, dg).ok());
      return std::vector<std::vector<float>>{c.down(y, sz), c.down(rstd, static_cast<size_t>(n)),
                                             c.down(dx, sz), c.down(dg, dg0.size())};
    };
    const auto a = run(cpu, tc), b = run(gpu, tg);
    expect_close("rms_norm forward", a[0], b[0], 1e-6);
    expect_close("rms_norm rstd", a[1], b[1], 1e-6);
    expect_close("rms_norm dx (added)", a[2], b[2], 1e-5);
    expect_close("rms_norm dg (accumulated)", a[3], b[3], 1e-5);
  }
  {
    auto run = [&](dev_ctx& c, train::train_kernels& k) {
      float* h = c.zeros(sz);
      float* dgate = c.zeros(sz);
      float* dup = c.zeros(sz);
      EXPECT_TRUE(k.swiglu_forward(c.up(x), c.up(u), static_cast<int64_t>(sz), h).ok());
      EXPECT_TRUE(
          k.swiglu_backward(c.up(x), c.up(u), c.up(dy), static_cast<int64_t>(sz), dgate, dup).ok());
      return std::vector<std::vector<float>>{c.down(h, sz), c.down(dgate, sz), c.down(dup, sz)};
    };
    const auto a = run(cpu, tc), b = run(gpu, tg);
    expect_close("swiglu forward", a[0], b[0], 1e-6);
    expect_close("swiglu dgate", a[1], b[1], 1e-6);
    expect_close("swiglu dup", a[2], b[2], 1e-6);
  }
  for (rope_style style : {rope_style::normal, rope_style::neox}) {
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i * 211);
    rope_config rc;
    rc.style = style;
    rc.n_dims = hd;
    rc.freq_base = 10000.0f;
    const auto table = train::make_rope_table(pos, rc);
    for (bool inverse : {false, true}) {
      auto run = [&](dev_ctx& c, train::train_kernels& k) {
        float* v = c.up(x);
        EXPECT_TRUE(
            k.rope_apply(v, n, heads, hd, c.up(table.cos), c.up(table.sin), hd, style, inverse)
                .ok());
        return c.down(v, sz);
      };
      const std::string what = std::string{"rope "} +
                               (style == rope_style::normal ? "normal" : "neox") +
                               (inverse ? " inverse" : "");
      expect_close(what.c_str(), run(cpu, tc), run(gpu, tg), 1e-6);
    }
  }
}

TEST(cuda_vs_cpu_train, attention_packed_sequences_with_shared_prefix) {
  WEFT_BOTH_TRAINERS;
  // Four sequences: 0 (7 tokens) is the shared prompt of 1 and 2 (GRPO samples: 5 and 9 tokens);
  // 3 (12 tokens) stands alone. GQA: 6 heads over 2 KV heads, head_dim 64.
  packed_sequences ps;
  ps.starts = {0, 7, 12, 21, 33};
  ps.prefix = {-1, 0, 0, -1};
  const attention_shape shape{6, 2, 64, 1.0 / 8.0};
  const int64_t nt = ps.n_tokens(), qd = shape.n_heads * shape.head_dim,
                kvd = shape.n_kv_heads * shape.head_dim;
  const auto q = randn(static_cast<size_t>(nt * qd), 12),
             k = randn(static_cast<size_t>(nt * kvd), 13),
             v = randn(static_cast<size_t>(nt * kvd), 14),
             dout = randn(static_cast<size_t>(nt * qd), 15);
  auto run = [&](dev_ctx& c, train::train_kernels& kern) {
    device_sequences ds;
    ds.starts = c.up(ps.starts);
    ds.prefix = c.up(ps.prefix);
    ds.n_seqs = ps.n_seqs();
    ds.n_tokens = nt;
    float* out = c.zeros(q.size());
    float* lse = c.zeros(static_cast<size_t>(nt * shape.n_heads));
    float *dq = c.zeros(q.size()), *dk = c.zeros(k.size()), *dv = c.zeros(v.size());
    const float *qp = c.up(q), *kp = c.up(k), *vp = c.up(v);
    EXPECT_TRUE(kern.attention_forward(qp, kp, vp, ds, shape, out, lse).ok());
    EXPECT_TRUE(
        kern.attention_backward(qp, kp, vp, out, lse, c.up(dout), ds, shape, dq, dk, dv).ok());
    return std::vector<std::vector<float>>{
        c.down(out, q.size()), c.down(lse, static_cast<size_t>(nt * shape.n_heads)),
        c.down(dq, q.size()), c.down(dk, k.size()), c.down(dv, v.size())};
  };
  const auto a = run(cpu, tc), b = run(gpu, tg);
  expect_close("attention out", a[0], b[0], 1e-5);
  expect_close("attention lse", a[1], b[1], 1e-5);
  expect_close("attention dq", a[2], b[2], 1e-4);
  expect_close("attention dk", a[3], b[3], 1e-4);
  expect_close("attention dv", a[4], b[4], 1e-4);
}

TEST(cuda_vs_cpu_train, cross_entropy_logprobs_and_gradient) {
  WEFT_BOTH_TRAINERS;
  const int64_t n = 5, vocab = 49152;
  const auto logits = randn(static_cast<size_t>(n * vocab), 16, 3.0f);
  const std::vector<int32_t> targets = {0, 17, 49151, 1234, 17};
  auto run = [&](dev_ctx& c, train::train_kernels& k) {
    float* dl = c.zeros(logits.size());
    auto* logp = static_cast<double*>(c.alloc(static_cast<size_t>(n) * sizeof(double)));
    EXPECT_TRUE(k.cross_entropy(c.up(logits), c.up(targets), n, vocab, 0.25f, dl, logp).ok());
    const auto lp = c.down(logp, static_cast<size_t>(n));
    return std::make_pair(c.down(dl, logits.size()), std::vector<float>(lp.begin(), lp.end()));
  };
  const auto a = run(cpu, tc), b = run(gpu, tg);
  expect_close("cross_entropy logp", a.second, b.second, 1e-6);
  expect_close("cross_entropy dlogits", a.first, b.first, 1e-6);
}

TEST(cuda_vs_cpu_train, results_do_not_depend_on_the_run) {
  // No atomics: two runs of the attention backward give the same bits (data-parallel exactness).
  WEFT_BOTH_TRAINERS;
  packed_sequences ps;
  ps.starts = {0, 40, 95};
  const attention_shape shape{4, 2, 64, 0.125};
  const int64_t nt = ps.n_tokens(), qd = 256, kvd = 128;
  const auto q = randn(static_cast<size_t>(nt * qd), 17),
             k = randn(static_cast<size_t>(nt * kvd), 18),
             v = randn(static_cast<size_t>(nt * kvd), 19),
             dout = randn(static_cast<size_t>(nt * qd), 20);
  device_sequences ds;
  ds.starts = gpu.up(ps.starts);
  ds.n_seqs = ps.n_seqs();
  ds.n_tokens = nt;
  const float *qp = gpu.up(q), *kp = gpu.up(k), *vp = gpu.up(v), *dop = gpu.up(dout);
  std::vector<std::vector<float>> runs;
  for (int r = 0; r < 2; ++r) {
    float* out = gpu.zeros(q.size());
    float* lse = gpu.zeros(static_cast<size_t>(nt * 4));
    float *dq = gpu.zeros(q.size()), *dk = gpu.zeros(k.size()), *dv = gpu.zeros(v.size());
    ASSERT_TRUE(tg.attention_forward(qp, kp, vp, ds, shape, out, lse).ok());
    ASSERT_TRUE(tg.attention_backward(qp, kp, vp, out, lse, dop, ds, shape, dq, dk, dv).ok());
    auto all = gpu.down(dq, q.size());
    const auto dkh = gpu.down(dk, k.size());
    all.insert(all.end(), dkh.begin(), dkh.end());
    runs.push_back(all);
  }
  EXPECT_EQ(runs[0], runs[1]);
  (void)tc;
}

TEST(cuda_vs_cpu_train, trainable_model_on_cuda_matches_the_host) {
  // The whole model's forward and backward on the GPU (trainable_model::use_device) against the
  // host path: masked prompts, a shared prefix, a per-token objective, SGD steps between.
  dev_ctx gpu("cuda");
  if (!gpu.d) GTEST_SKIP() << "no CUDA device can be opened here (the CUDA backend did not run)";
  for (bool recompute : {false, true}) {
    for (bool tied : {false, true}) {
      const auto a = compare_device_training(*gpu.d, recompute, tied);
      const auto b = compare_device_training(*gpu.d, recompute, tied);
      EXPECT_LE(a.loss_rel, 1e-5);
      EXPECT_LE(a.grad_rel, 1e-4);
      // The same calls give the same bits on the device: two runs differ from the host equally.
      EXPECT_EQ(a.loss_rel, b.loss_rel);
      EXPECT_EQ(a.grad_rel, b.grad_rel);
    }
    // Mixture of experts (routing on the host; mixing and its backward as CUDA kernels).
    const auto m = compare_device_training(*gpu.d, recompute, false, 3, 4);
    EXPECT_LE(m.loss_rel, 1e-5);
    EXPECT_LE(m.grad_rel, 1e-4);
  }
}

TEST(cuda_vs_cpu_train, device_resident_sft_steps_match_the_host_loop) {
  // sft_trainer with the whole step on the GPU (AdamW, clipping, the gradient sum) and with the
  // optimizer offloaded, against the host loop; a resumed GPU run equals the straight GPU run.
  dev_ctx gpu("cuda");
  if (!gpu.d) GTEST_SKIP() << "no CUDA device can be opened here (the CUDA backend did not run)";
  for (bool offload : {false, true}) {
    const auto d = weft::gpu::testing::compare_resident_training(*gpu.d, offload);
    EXPECT_LE(d.loss_rel, 1e-5);
    EXPECT_LE(d.norm_rel, 1e-5);
    // Adam's update is ~lr·sign(g) wherever |g| is well above eps, so a gradient that differs by
    // rounding near zero can move a weight by up to ~lr either way: the weights are checked at
    // that scale (lr 2e-3 × 4 steps against weights of order 0.1), the moments closely.
    EXPECT_LE(d.weight_rel, 1e-1);
    EXPECT_LE(d.moment_rel, 1e-4);
    EXPECT_TRUE(d.resume_exact);
  }
}

TEST(cuda_vs_cpu_train, grpo_with_trainer_reference_and_rollout_engine_on_cuda_matches_the_host) {
  // `weft rl --device cuda`: the trainer device-resident, the KL reference's forward and the
  // rollout engine on the GPU, against the loop on the host. Rollouts sample with the same seeds
  // from logits that agree within rounding, so the same tokens come out, and the updates agree
  // within the trainer's tolerances. The learning rate is small: AdamW moves every weight by ~lr
  // whatever its gradient's size, so where a gradient is rounding-small its sign (and so a move of
  // 2·lr) differs between the two; at a large lr that compounds over steps into different
  // rollouts (measured on the H100: at lr 3e-3 the KL after one step was 0.107 vs 0.124).
  dev_ctx gpu("cuda");
  if (!gpu.d) GTEST_SKIP() << "no CUDA device can be opened here (the CUDA backend did not run)";
  const auto file = weft::gpu::rl_test::tiny_file();
  weft::gpu::rl_test::digits_task task;
  auto cfg = weft::gpu::rl_test::tiny_loop_config();
  cfg.schedule.peak = 1e-4;
  cfg.schedule.decay = train::lr_schedule::shape::cosine;  // as run on the H100
  cfg.grpo.kl_coef = 0.05;
  auto make = [&](const char* dev) {
    cfg.train_device = dev;
    cfg.rollout_device = dev;
    auto m = train::trainable_model<float>::load(file);
    EXPECT_TRUE(m.ok());
    auto loop = rl::grpo_loop::create(file, std::move(*m), task, cfg);
    EXPECT_TRUE(loop.ok()) << loop.error().message();
    return std::move(*loop);
  };
  auto host = make("cpu");
  auto cuda = make("cuda");
  double norm_scale = 0.0;  // the first step's norm: later ones can cancel to far less
  for (int s = 0; s < 3; ++s) {
    auto a = host->step();
    auto b = cuda->step();
    ASSERT_TRUE(a.ok() && b.ok()) << (a.ok() ? b.error().message() : a.error().message());
    EXPECT_EQ(a->completion_tokens, b->completion_tokens) << "step " << s + 1;
    EXPECT_NEAR(a->reward_mean, b->reward_mean, 1e-12) << "step " << s + 1;
    EXPECT_NEAR(a->loss, b->loss, 1e-4 * (1.0 + std::fabs(a->loss))) << "step " << s + 1;
    if (s == 0) norm_scale = a->grad_norm;
    // Measured on the H100: 0.00457 vs 0.00486 at step 3, after steps of norm ~0.8.
    EXPECT_NEAR(a->grad_norm, b->grad_norm, 1e-3 * norm_scale) << "step " << s + 1;
    // The KL to the reference grows with the squared distance moved, which the sign effect
    // above changes by a share that does not shrink with lr.
    EXPECT_NEAR(a->kl, b->kl, 1e-7 + 0.3 * a->kl) << "step " << s + 1;
    if (s > 0) {
      EXPECT_GT(b->kl, 0.0) << "step " << s + 1;  // the reference is not the moving policy
    }
  }
  auto ea = host->evaluate();
  auto eb = cuda->evaluate();
  ASSERT_TRUE(ea.ok() && eb.ok());
  EXPECT_EQ(ea->completion_len, eb->completion_len);
}

}  // namespace

namespace {

TEST(cuda_vs_cpu_train, nccl_group_of_one_gpu_sums_the_device_gradients_in_place) {
  // `weft train --dist-backend nccl`'s mechanics on one GPU (the most a single-GPU machine can
  // run): a device_group of one rank over the NCCL engine, bootstrapped over a peer group, sums
  // the trainer's device gradient buffers in place — an identity for one rank, so the updates
  // equal a run without a reducer, bit for bit. Checks the registration of the device's buffers,
  // the ordering between the trainer's stream and NCCL's, and completion.
  using namespace weft::gpu::train;
  dev_ctx gpu("cuda");
  if (!gpu.d) GTEST_SKIP() << "no CUDA device can be opened here (the CUDA backend did not run)";
  auto boot = weft::transport::make_engine("inproc", {});
  ASSERT_TRUE(boot.ok());
  auto address = (*boot)->local_address();
  ASSERT_TRUE(address.ok());
  auto peers = weft::transport::peer_group::connect(**boot, 0, {*address});
  ASSERT_TRUE(peers.ok());
  weft::transport::device_group_options o;
  o.timeout_ms = 30'000;
  auto group = weft::transport::device_group::join(**peers, o);
  ASSERT_TRUE(group.ok()) << group.error().to_string();
  auto img = make_tiny_model(training_model_config(true));
  ASSERT_TRUE(img.ok());
  const sft_dataset data = random_sft_data(7, 12, 3);
  const sft_config sc = small_sft_config(4, 48, 3);
  std::vector<std::vector<step_record>> history;
  std::vector<checkpoint_state> state;
  int calls = 0;
  for (bool nccl : {false, true}) {
    auto f = gguf_file::parse(*img);
    ASSERT_TRUE(f.ok());
    auto m = trainable_model<float>::load(*f);
    ASSERT_TRUE(m.ok());
    ASSERT_TRUE((*m)->use_device(gpu.d.get()).ok());
    sft_trainer t(**m, data, sc);
    if (nccl) {
      t.set_device_reducer([&](std::span<const std::span<float>> g, double&, int64_t&) {
        ++calls;
        auto s = (*group)->all_reduce_sum(g);
        return s.ok() ? status{} : status{status_code::internal, s.to_string()};
      });
    }
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(t.step().ok());
    auto snap = t.snapshot();
    ASSERT_TRUE(snap.ok());
    history.push_back(t.history());
    state.push_back(std::move(*snap));
  }
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(history[0], history[1]);
  EXPECT_EQ(state[0].values, state[1].values);
}

}  // namespace
