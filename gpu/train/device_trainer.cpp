#include "gpu/train/device_trainer.hpp"

#include <algorithm>
#include <cmath>
#include <thread>

#include "gpu/train/moe_ops.hpp"
#include "gpu/train/train_kernels.hpp"

namespace weft::gpu::train {

namespace {

/// A device buffer that grows on demand (contents are not kept across growth).
struct dbuf {
  device_buffer b;
  template <class U>
  result<U*> need(device& d, int64_t count) {
    const size_t bytes = std::max<size_t>(static_cast<size_t>(count) * sizeof(U), 64);
    if (b.size_bytes < bytes) {
      d.release(b);
      b = {};
      auto r = d.allocate(bytes);
      if (!r) return r.error();
      b = *r;
    }
    return static_cast<U*>(b.data);
  }
  template <class U>
  U* get() const {
    return static_cast<U*>(b.data);
  }
};

/// moe_routing::for_each_expert for calls that can fail: stops at the first error and returns it.
template <class F>
status for_each_expert(const moe_routing<float>& r, F&& f) {
  status st;
  r.for_each_expert([&](int64_t e, int64_t r0, int64_t m) {
    if (st) st = f(e, r0, m);
  });
  return st;
}

#define WEFT_TRY(expr)             \
  do {                             \
    if (auto st_ = (expr); !st_) { \
      return st_;                  \
    }                              \
  } while (0)

#define WEFT_NEED(ptr, buf, type, count)                \
  do {                                                  \
    auto r_ = (buf).template need<type>(dev_, (count)); \
    if (!r_) return r_.error();                         \
    ptr = *r_;                                          \
  } while (0)

}  // namespace

/// One block's saved activations. MoE: gate/up/h are per routed row; the routing stays on the
/// host (route) with its index lists and weights on the device.
struct layer_bufs {
  dbuf x_in, xn1, rstd1, q, k, v, att, lse, x_mid, xn2, rstd2, gate, up, h;
  dbuf exp_in, exp_out, row_token, row_slot, slot_row, weights;
  moe_routing<float> route;
};

struct device_trainer::state {
  std::vector<dbuf> value, grad;   ///< Per parameter.
  std::vector<dbuf> m, v;          ///< AdamW's moments per parameter (resident mode).
  dbuf norm_acc;                   ///< One double: the squared gradient norm.
  std::vector<layer_bufs> layers;  ///< n_layers of them, plus the recompute scratch at the end.
  dbuf x, xn_final, rstd_final, x_out;
  dbuf dh, dgate, dup, dxn, datt, dq, dk, dv, dx, dxn_final;
  dbuf xc, logits, dlogits, dxc, logp, scales;
  dbuf tokens, rows, targets, starts, prefix, rope_cos, rope_sin;
  dbuf router_logits, dexp_out, dexp_in, dweights, droute;  ///< One MoE block's.
  std::vector<float> moe_host;                              ///< Host copies for the routing.
  moe_balance<float> balance;                               ///< The batch's routing (balance loss).
  const train_batch* batch = nullptr;                       ///< The batch in flight.
  int64_t routes_forced = 0, routes_differ = 0;             ///< Routing replay.
  std::vector<float> balance_grad;                          ///< Empty: no balance loss.
  int64_t n = 0;                                            ///< Tokens of the batch in flight.
  device_sequences seqs;
  attention_shape shape;
  std::vector<float> staging;  ///< Host copy of one gradient tensor.
  std::vector<device_buffer*> all() {
    std::vector<device_buffer*> out;
    for (auto& b : value) out.push_back(&b.b);
    for (auto& b : grad) out.push_back(&b.b);
    for (auto& b : m) out.push_back(&b.b);
    for (auto& b : v) out.push_back(&b.b);
    out.push_back(&norm_acc.b);
    for (auto& l : layers) {
      for (dbuf* p :
           {&l.x_in,   &l.xn1,     &l.rstd1,     &l.q,        &l.k,        &l.v,      &l.att,
            &l.lse,    &l.x_mid,   &l.xn2,       &l.rstd2,    &l.gate,     &l.up,     &l.h,
            &l.exp_in, &l.exp_out, &l.row_token, &l.row_slot, &l.slot_row, &l.weights})
        out.push_back(&p->b);
    }
    for (dbuf* p :
         {&x,        &xn_final, &rstd_final, &x_out,  &dh,       &dgate,    &dup,
          &dxn,      &datt,     &dq,         &dk,     &dv,       &dx,       &dxn_final,
          &xc,       &logits,   &dlogits,    &dxc,    &logp,     &scales,   &tokens,
          &rows,     &targets,  &starts,     &prefix, &rope_cos, &rope_sin, &router_logits,
          &dexp_out, &dexp_in,  &dweights,   &droute})
      out.push_back(&p->b);
    return out;
  }
};

device_trainer::device_trainer(device& dev, const model_hparams& hp, const trainable_config& config,
                               trainable_layout layout)
    : dev_(dev),
      hp_(hp),
      recompute_(config.recompute),
      head_chunk_rows_(std::max<int64_t>(1, config.head_chunk_rows)),
      router_aux_loss_coef_(config.router_aux_loss_coef),
      layout_(std::move(layout)),
      s_(std::make_unique<state>()) {
  s_->layers.resize(static_cast<size_t>(hp_.n_layers) + 1);
}

device_trainer::~device_trainer() {
  for (device_buffer* b : s_->all()) dev_.release(*b);
}

status device_trainer::upload(const std::vector<parameter<float>>& params) {
  if (values_newer_)
    return {status_code::internal,
            "the parameters were changed on the host while the device held newer ones (bring "
            "the host copy up to date with trainable_model::pull_to_host first)"};
  s_->value.resize(params.size());
  s_->grad.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    float* v = nullptr;
    WEFT_NEED(v, s_->value[i], float, params[i].size());
    WEFT_TRY(
        dev_.copy_to_device(v, params[i].value.data(), params[i].value.size() * sizeof(float)));
    if (auto g = s_->grad[i].need<float>(dev_, params[i].size()); !g) return g.error();
  }
  return dev_.synchronize();
}

status device_trainer::forward(const train_batch& b) {
  state& s = *s_;
  const int64_t n = b.n_tokens();
  const int64_t d = hp_.n_embd;
  s.n = n;
  s.batch = &b;
  // Positions (a shared prefix shifts its continuations) and the RoPE table, on the host.
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t q = 0; q < b.seqs.n_seqs(); ++q) {
    for (int64_t i = b.seqs.starts[static_cast<size_t>(q)];
         i < b.seqs.starts[static_cast<size_t>(q) + 1]; ++i) {
      pos[static_cast<size_t>(i)] = static_cast<int32_t>(i - b.seqs.starts[static_cast<size_t>(q)] +
                                                         b.seqs.first_position(q));
    }
  }
  rope_config rc = hp_.rope;
  rc.freq_factors = layout_.rope_freqs.empty() ? nullptr : layout_.rope_freqs.data();
  const rope_table table = make_rope_table(pos, rc);
  double *cs = nullptr, *sn = nullptr;
  WEFT_NEED(cs, s.rope_cos, double, static_cast<int64_t>(table.cos.size()));
  WEFT_NEED(sn, s.rope_sin, double, static_cast<int64_t>(table.sin.size()));
  WEFT_TRY(dev_.copy_to_device(cs, table.cos.data(), table.cos.size() * sizeof(double)));
  WEFT_TRY(dev_.copy_to_device(sn, table.sin.data(), table.sin.size() * sizeof(double)));
  int32_t* tok = nullptr;
  WEFT_NEED(tok, s.tokens, int32_t, n);
  WEFT_TRY(dev_.copy_to_device(tok, b.tokens.data(), b.tokens.size() * sizeof(int32_t)));
  int64_t* st = nullptr;
  WEFT_NEED(st, s.starts, int64_t, static_cast<int64_t>(b.seqs.starts.size()));
  WEFT_TRY(dev_.copy_to_device(st, b.seqs.starts.data(), b.seqs.starts.size() * sizeof(int64_t)));
  s.seqs = {st, nullptr, b.seqs.n_seqs(), n};
  if (!b.seqs.prefix.empty()) {
    int64_t* pr = nullptr;
    WEFT_NEED(pr, s.prefix, int64_t, static_cast<int64_t>(b.seqs.prefix.size()));
    WEFT_TRY(dev_.copy_to_device(pr, b.seqs.prefix.data(), b.seqs.prefix.size() * sizeof(int64_t)));
    s.seqs.prefix = pr;
  }
  s.shape = {hp_.n_heads, hp_.n_kv_heads, hp_.head_dim,
             1.0 / std::sqrt(static_cast<double>(hp_.head_dim))};
  // The embedding rows.
  float* x = nullptr;
  WEFT_NEED(x, s.x, float, n* d);
  tensor_view embd;
  embd.type = ggml_type::f32;
  embd.data = s.value[static_cast<size_t>(layout_.embd)].get<float>();
  embd.n_cols = d;
  embd.n_rows = hp_.n_vocab;
  embd.row_bytes = static_cast<size_t>(d) * sizeof(float);
  embd.mat_bytes = embd.row_bytes * static_cast<size_t>(hp_.n_vocab);
  WEFT_TRY(dev_.ops().get_rows(embd, tok, n, x));
  if (!layout_.moe.empty()) s.balance.reset(hp_.n_experts);
  for (int64_t il = 0; il < hp_.n_layers; ++il) {
    float* x_in = nullptr;
    WEFT_NEED(x_in, s.layers[static_cast<size_t>(il)].x_in, float, n* d);
    WEFT_TRY(dev_.copy_on_device(x_in, x, static_cast<size_t>(n * d) * sizeof(float)));
    const int acts = recompute_ ? static_cast<int>(hp_.n_layers) : static_cast<int>(il);
    WEFT_TRY(layer_forward(il, x_in, acts, x));
    if (!layout_.moe.empty()) {
      const moe_routing<float>& r = s.layers[static_cast<size_t>(acts)].route;
      s.balance.add(r);
      s.routes_forced += r.forced;
      s.routes_differ += r.differ;
    }
  }
  float *xn = nullptr, *rstd = nullptr;
  WEFT_NEED(xn, s.xn_final, float, n* d);
  WEFT_NEED(rstd, s.rstd_final, float, n);
  return dev_.training()->rms_norm_forward(
      x, s.value[static_cast<size_t>(layout_.out_norm)].get<float>(), n, d, hp_.rms_eps, xn, rstd);
}

status device_trainer::layer_forward(int64_t il, const float* x_in, int acts, float* x_out) {
  state& s = *s_;
  train_kernels& k = *dev_.training();
  const auto& l = layout_.layers[static_cast<size_t>(il)];
  layer_bufs& a = s.layers[static_cast<size_t>(acts)];
  const int64_t n = s.n, d = hp_.n_embd, qd = hp_.n_heads * hp_.head_dim,
                kvd = hp_.n_kv_heads * hp_.head_dim, ff = hp_.n_ff;
  auto w = [&](int i) {
    return s.value[static_cast<size_t>(l[static_cast<size_t>(i)])].get<float>();
  };
  const bool moe = !layout_.moe.empty();
  float *xn1, *rstd1, *q, *kk, *v, *att, *lse, *x_mid, *xn2, *rstd2, *gate = nullptr, *up = nullptr,
                                                                     *h = nullptr;
  WEFT_NEED(xn1, a.xn1, float, n* d);
  WEFT_NEED(rstd1, a.rstd1, float, n);
  WEFT_NEED(q, a.q, float, n* qd);
  WEFT_NEED(kk, a.k, float, n* kvd);
  WEFT_NEED(v, a.v, float, n* kvd);
  WEFT_NEED(att, a.att, float, n* qd);
  WEFT_NEED(lse, a.lse, float, n* hp_.n_heads);
  WEFT_NEED(x_mid, a.x_mid, float, n* d);
  WEFT_NEED(xn2, a.xn2, float, n* d);
  WEFT_NEED(rstd2, a.rstd2, float, n);
  if (!moe) {
    WEFT_NEED(gate, a.gate, float, n* ff);
    WEFT_NEED(up, a.up, float, n* ff);
    WEFT_NEED(h, a.h, float, n* ff);
  }
  const double* cs = s.rope_cos.get<double>();
  const double* sn = s.rope_sin.get<double>();
  const int64_t rd = hp_.rope.n_dims;
  WEFT_TRY(k.rms_norm_forward(x_in, w(0), n, d, hp_.rms_eps, xn1, rstd1));
  WEFT_TRY(k.linear_forward(xn1, w(1), n, d, qd, q));
  WEFT_TRY(k.linear_forward(xn1, w(2), n, d, kvd, kk));
  WEFT_TRY(k.linear_forward(xn1, w(3), n, d, kvd, v));
  WEFT_TRY(k.rope_apply(q, n, hp_.n_heads, hp_.head_dim, cs, sn, rd, hp_.rope.style, false));
  WEFT_TRY(k.rope_apply(kk, n, hp_.n_kv_heads, hp_.head_dim, cs, sn, rd, hp_.rope.style, false));
  WEFT_TRY(k.attention_forward(q, kk, v, s.seqs, s.shape, att, lse));
  WEFT_TRY(k.linear_forward(att, w(4), n, qd, d, x_mid));
  WEFT_TRY(dev_.ops().add(x_mid, x_in, x_mid, n * d));
  WEFT_TRY(k.rms_norm_forward(x_mid, w(5), n, d, hp_.rms_eps, xn2, rstd2));
  if (moe) {
    WEFT_TRY(moe_forward(il, acts, x_out));
    return dev_.ops().add(x_out, x_mid, x_out, n * d);
  }
  WEFT_TRY(k.linear_forward(xn2, w(6), n, d, ff, gate));
  WEFT_TRY(k.linear_forward(xn2, w(7), n, d, ff, up));
  WEFT_TRY(k.swiglu_forward(gate, up, n * ff, h));
  WEFT_TRY(k.linear_forward(h, w(8), n, ff, d, x_out));
  return dev_.ops().add(x_out, x_mid, x_out, n * d);
}

status device_trainer::moe_forward(int64_t il, int acts, float* y) {
  state& s = *s_;
  train_kernels& k = *dev_.training();
  const auto& me = layout_.moe[static_cast<size_t>(il)];
  layer_bufs& a = s.layers[static_cast<size_t>(acts)];
  const int64_t n = s.n, d = hp_.n_embd, ne = hp_.n_experts, eff = layout_.moe_ff;
  auto w = [&](int i) {
    return s.value[static_cast<size_t>(me[static_cast<size_t>(i)])].get<float>();
  };
  const float* xn2 = a.xn2.get<float>();
  // Routing on the host, from the router's logits.
  float* logits = nullptr;
  WEFT_NEED(logits, s.router_logits, float, n* ne);
  WEFT_TRY(k.linear_forward(xn2, w(0), n, d, ne, logits));
  s.moe_host.resize(static_cast<size_t>(n * ne));
  WEFT_TRY(dev_.copy_to_host(s.moe_host.data(), logits, s.moe_host.size() * sizeof(float)));
  WEFT_TRY(dev_.synchronize());
  moe_routing<float>& r = a.route;
  const int64_t kk = hp_.n_experts_used;
  const train_batch& b = *s.batch;
  if (b.routes.empty()) {
    moe_route(s.moe_host.data(), n, ne, kk, r);
  } else {
    moe_route(s.moe_host.data(), n, ne, kk, r, b.routes.data() + il * kk, b.route_width,
              static_cast<int64_t>(b.routes.size()) / b.route_width);
  }
  const int64_t rows = r.rows();
  int32_t *row_token, *row_slot, *slot_row;
  float *weights, *exp_in, *exp_out, *gate, *up, *h;
  WEFT_NEED(row_token, a.row_token, int32_t, rows);
  WEFT_NEED(row_slot, a.row_slot, int32_t, rows);
  WEFT_NEED(slot_row, a.slot_row, int32_t, rows);
  WEFT_NEED(weights, a.weights, float, rows);
  WEFT_NEED(exp_in, a.exp_in, float, rows* d);
  WEFT_NEED(exp_out, a.exp_out, float, rows* d);
  WEFT_NEED(gate, a.gate, float, rows* eff);
  WEFT_NEED(up, a.up, float, rows* eff);
  WEFT_NEED(h, a.h, float, rows* eff);
  WEFT_TRY(
      dev_.copy_to_device(row_token, r.row_token.data(), r.row_token.size() * sizeof(int32_t)));
  WEFT_TRY(dev_.copy_to_device(row_slot, r.row_slot.data(), r.row_slot.size() * sizeof(int32_t)));
  WEFT_TRY(dev_.copy_to_device(slot_row, r.slot_row.data(), r.slot_row.size() * sizeof(int32_t)));
  WEFT_TRY(dev_.copy_to_device(weights, r.weights.data(), r.weights.size() * sizeof(float)));
  WEFT_TRY(dev_.ops().gather_rows(xn2, row_token, rows, d, exp_in));
  WEFT_TRY(for_each_expert(r, [&](int64_t e, int64_t r0, int64_t m) -> status {
    WEFT_TRY(k.linear_forward(exp_in + r0 * d, w(1) + e * eff * d, m, d, eff, gate + r0 * eff));
    WEFT_TRY(k.linear_forward(exp_in + r0 * d, w(2) + e * eff * d, m, d, eff, up + r0 * eff));
    return {};
  }));
  WEFT_TRY(k.swiglu_forward(gate, up, rows * eff, h));
  WEFT_TRY(for_each_expert(r, [&](int64_t e, int64_t r0, int64_t m) -> status {
    WEFT_TRY(k.linear_forward(h + r0 * eff, w(3) + e * d * eff, m, eff, d, exp_out + r0 * d));
    return {};
  }));
  return k.moe_combine(exp_out, slot_row, weights, n, r.k, d, y);
}

std::pair<int64_t, int64_t> device_trainer::take_routing_stats() {
  const std::pair<int64_t, int64_t> out{s_->routes_forced, s_->routes_differ};
  s_->routes_forced = s_->routes_differ = 0;
  return out;
}

status device_trainer::moe_backward(int64_t il, int acts, const float* dy, float* dxn) {
  state& s = *s_;
  train_kernels& k = *dev_.training();
  const auto& me = layout_.moe[static_cast<size_t>(il)];
  layer_bufs& a = s.layers[static_cast<size_t>(acts)];
  const int64_t n = s.n, d = hp_.n_embd, ne = hp_.n_experts, eff = layout_.moe_ff;
  auto idx = [&](int i) { return static_cast<size_t>(me[static_cast<size_t>(i)]); };
  auto w = [&](int i) { return s.value[idx(i)].get<float>(); };
  auto g = [&](int i) { return s.grad[idx(i)].get<float>(); };
  const moe_routing<float>& r = a.route;
  const int64_t rows = r.rows();
  const auto* row_token = a.row_token.get<int32_t>();
  float *dout, *dw, *dh, *dgate, *dup, *din, *dl;
  WEFT_NEED(dout, s.dexp_out, float, rows* d);
  WEFT_NEED(dw, s.dweights, float, rows);
  WEFT_NEED(dh, s.dh, float, rows* eff);
  WEFT_NEED(dgate, s.dgate, float, rows* eff);
  WEFT_NEED(dup, s.dup, float, rows* eff);
  WEFT_NEED(din, s.dexp_in, float, rows* d);
  WEFT_NEED(dl, s.droute, float, n* ne);
  WEFT_TRY(k.moe_combine_backward(dy, a.exp_out.get<float>(), row_token, a.row_slot.get<int32_t>(),
                                  a.weights.get<float>(), rows, d, dout, dw));
  WEFT_TRY(for_each_expert(r, [&](int64_t e, int64_t r0, int64_t m) -> status {
    WEFT_TRY(k.linear_backward(a.h.get<float>() + r0 * eff, w(3) + e * d * eff, dout + r0 * d, m,
                               eff, d, dh + r0 * eff, g(3) + e * d * eff, false));
    return {};
  }));
  WEFT_TRY(k.swiglu_backward(a.gate.get<float>(), a.up.get<float>(), dh, rows * eff, dgate, dup));
  WEFT_TRY(for_each_expert(r, [&](int64_t e, int64_t r0, int64_t m) -> status {
    const float* xe = a.exp_in.get<float>() + r0 * d;
    WEFT_TRY(k.linear_backward(xe, w(1) + e * eff * d, dgate + r0 * eff, m, d, eff, din + r0 * d,
                               g(1) + e * eff * d, false));
    WEFT_TRY(k.linear_backward(xe, w(2) + e * eff * d, dup + r0 * eff, m, d, eff, din + r0 * d,
                               g(2) + e * eff * d, true));
    return {};
  }));
  // Each row's input gradient back to its token, rows in order (the embedding backward's
  // scatter-add), then the router's gradient from ∂L/∂weights, on the host.
  WEFT_TRY(k.fill(dxn, n * d, 0.0f));
  WEFT_TRY(k.embedding_backward(din, row_token, rows, d, dxn));
  std::vector<float> dw_host(static_cast<size_t>(rows));
  WEFT_TRY(dev_.copy_to_host(dw_host.data(), dw, dw_host.size() * sizeof(float)));
  WEFT_TRY(dev_.synchronize());
  s.moe_host.resize(static_cast<size_t>(n * ne));
  moe_router_backward(r, dw_host.data(), s.moe_host.data());
  if (!s.balance_grad.empty()) moe_balance_backward(r, s.balance_grad, s.moe_host.data());
  WEFT_TRY(dev_.copy_to_device(dl, s.moe_host.data(), s.moe_host.size() * sizeof(float)));
  return k.linear_backward(a.xn2.get<float>(), w(0), dl, n, d, ne, dxn, g(0), true);
}

status device_trainer::layer_backward(int64_t il, int acts, const float* x_in, float* dx) {
  state& s = *s_;
  train_kernels& k = *dev_.training();
  const auto& l = layout_.layers[static_cast<size_t>(il)];
  layer_bufs& a = s.layers[static_cast<size_t>(acts)];
  const int64_t n = s.n, d = hp_.n_embd, qd = hp_.n_heads * hp_.head_dim,
                kvd = hp_.n_kv_heads * hp_.head_dim, ff = hp_.n_ff;
  auto idx = [&](int i) { return static_cast<size_t>(l[static_cast<size_t>(i)]); };
  auto w = [&](int i) { return s.value[idx(i)].get<float>(); };
  auto g = [&](int i) { return s.grad[idx(i)].get<float>(); };
  const bool moe = !layout_.moe.empty();
  float *dh = nullptr, *dgate = nullptr, *dup = nullptr, *dxn, *datt, *dq, *dk, *dv;
  if (!moe) {
    WEFT_NEED(dh, s.dh, float, n* ff);
    WEFT_NEED(dgate, s.dgate, float, n* ff);
    WEFT_NEED(dup, s.dup, float, n* ff);
  }
  WEFT_NEED(dxn, s.dxn, float, n* d);
  WEFT_NEED(datt, s.datt, float, n* qd);
  WEFT_NEED(dq, s.dq, float, n* qd);
  WEFT_NEED(dk, s.dk, float, n* kvd);
  WEFT_NEED(dv, s.dv, float, n* kvd);
  const double* cs = s.rope_cos.get<double>();
  const double* sn = s.rope_sin.get<double>();
  const int64_t rd = hp_.rope.n_dims;
  // dx holds ∂L/∂x_out; the feed-forward half, then the attention half (as trainable_model).
  if (moe) {
    WEFT_TRY(moe_backward(il, acts, dx, dxn));
  } else {
    WEFT_TRY(k.linear_backward(a.h.get<float>(), w(8), dx, n, ff, d, dh, g(8), false));
    WEFT_TRY(k.swiglu_backward(a.gate.get<float>(), a.up.get<float>(), dh, n * ff, dgate, dup));
    WEFT_TRY(k.linear_backward(a.xn2.get<float>(), w(6), dgate, n, d, ff, dxn, g(6), false));
    WEFT_TRY(k.linear_backward(a.xn2.get<float>(), w(7), dup, n, d, ff, dxn, g(7), true));
  }
  WEFT_TRY(
      k.rms_norm_backward(a.x_mid.get<float>(), w(5), a.rstd2.get<float>(), dxn, n, d, dx, g(5)));
  WEFT_TRY(k.linear_backward(a.att.get<float>(), w(4), dx, n, qd, d, datt, g(4), false));
  WEFT_TRY(k.attention_backward(a.q.get<float>(), a.k.get<float>(), a.v.get<float>(),
                                a.att.get<float>(), a.lse.get<float>(), datt, s.seqs, s.shape, dq,
                                dk, dv));
  WEFT_TRY(k.rope_apply(dq, n, hp_.n_heads, hp_.head_dim, cs, sn, rd, hp_.rope.style, true));
  WEFT_TRY(k.rope_apply(dk, n, hp_.n_kv_heads, hp_.head_dim, cs, sn, rd, hp_.rope.style, true));
  WEFT_TRY(k.linear_backward(a.xn1.get<float>(), w(1), dq, n, d, qd, dxn, g(1), false));
  WEFT_TRY(k.linear_backward(a.xn1.get<float>(), w(2), dk, n, d, kvd, dxn, g(2), true));
  WEFT_TRY(k.linear_backward(a.xn1.get<float>(), w(3), dv, n, d, kvd, dxn, g(3), true));
  return k.rms_norm_backward(x_in, w(0), a.rstd1.get<float>(), dxn, n, d, dx, g(0));
}

status device_trainer::accumulate(const train_batch& b, const token_objective<float>* objective,
                                  loss_sum& loss) {
  WEFT_TRY(forward(b));
  state& s = *s_;
  train_kernels& k = *dev_.training();
  const int64_t n = s.n, d = hp_.n_embd, vocab = hp_.n_vocab;
  float* out_w = s.value[static_cast<size_t>(layout_.output)].get<float>();
  float* out_g = s.grad[static_cast<size_t>(layout_.output)].get<float>();
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < n; ++i) {
    if (b.targets[static_cast<size_t>(i)] >= 0) rows.push_back(i);
  }
  loss.tokens += static_cast<int64_t>(rows.size());
  s.balance_grad.clear();
  if (!layout_.moe.empty() && router_aux_loss_coef_ > 0.0) {
    // The load-balancing loss, weighted like the micro-batch's loss (balance_weight).
    const double scale = router_aux_loss_coef_ * balance_weight(b, rows, objective != nullptr);
    loss.sum += scale * s.balance.loss();
    s.balance_grad = s.balance.prob_grad(scale);
  }
  float* dxn = nullptr;
  WEFT_NEED(dxn, s.dxn_final, float, n* d);
  WEFT_TRY(k.fill(dxn, n * d, 0.0f));
  const int64_t chunk = head_chunk_rows_;
  std::vector<int32_t> ids, targets;
  std::vector<double> logp;
  std::vector<float> logp_f, dlogp, scales;
  for (size_t r0 = 0; r0 < rows.size(); r0 += static_cast<size_t>(chunk)) {
    const int64_t m = std::min<int64_t>(chunk, static_cast<int64_t>(rows.size() - r0));
    ids.resize(static_cast<size_t>(m));
    targets.resize(static_cast<size_t>(m));
    for (int64_t j = 0; j < m; ++j) {
      const int64_t row = rows[r0 + static_cast<size_t>(j)];
      ids[static_cast<size_t>(j)] = static_cast<int32_t>(row);
      targets[static_cast<size_t>(j)] = b.targets[static_cast<size_t>(row)];
    }
    int32_t *rid, *tgt;
    float *xc, *logits, *dlogits, *dxc;
    double* lp;
    WEFT_NEED(rid, s.rows, int32_t, m);
    WEFT_NEED(tgt, s.targets, int32_t, m);
    WEFT_NEED(xc, s.xc, float, m* d);
    WEFT_NEED(logits, s.logits, float, m* vocab);
    WEFT_NEED(dlogits, s.dlogits, float, m* vocab);
    WEFT_NEED(dxc, s.dxc, float, m* d);
    WEFT_NEED(lp, s.logp, double, m);
    WEFT_TRY(dev_.copy_to_device(rid, ids.data(), ids.size() * sizeof(int32_t)));
    WEFT_TRY(dev_.copy_to_device(tgt, targets.data(), targets.size() * sizeof(int32_t)));
    WEFT_TRY(dev_.ops().gather_rows(s.xn_final.get<float>(), rid, m, d, xc));
    WEFT_TRY(k.linear_forward(xc, out_w, m, d, vocab, logits));
    // A per-token objective at a sampling temperature: log p = log-softmax(logits / t).
    const bool tempered = objective != nullptr && logit_temperature_ != 1.0f;
    if (tempered) {
      float* sc = nullptr;
      WEFT_NEED(sc, s.scales, float, m);
      scales.assign(static_cast<size_t>(m), 1.0f / logit_temperature_);
      WEFT_TRY(dev_.copy_to_device(sc, scales.data(), scales.size() * sizeof(float)));
      WEFT_TRY(k.scale_rows(logits, sc, m, vocab));
    }
    WEFT_TRY(k.cross_entropy(logits, tgt, m, vocab, 1.0f, dlogits, lp));
    logp.resize(static_cast<size_t>(m));
    WEFT_TRY(dev_.copy_to_host(logp.data(), lp, logp.size() * sizeof(double)));
    WEFT_TRY(dev_.synchronize());
    if (objective == nullptr) {
      double total = 0.0;
      for (double v : logp) total -= v;
      loss.sum += total;
    } else {
      // dlogits = softmax − onehot = −∂logp/∂logits, so ∂ℓ/∂logits = −(dℓ/dlogp) · dlogits.
      logp_f.assign(logp.begin(), logp.end());
      dlogp.assign(static_cast<size_t>(m), 0.0f);
      loss.sum += (*objective)(
          b, std::span<const int64_t>(rows).subspan(r0, static_cast<size_t>(m)), logp_f, dlogp);
      scales.resize(static_cast<size_t>(m));
      // ∂/∂logits of a tempered log p carries another 1/t.
      const float inv_t = tempered ? 1.0f / logit_temperature_ : 1.0f;
      for (int64_t j = 0; j < m; ++j)
        scales[static_cast<size_t>(j)] = -dlogp[static_cast<size_t>(j)] * inv_t;
      float* sc = nullptr;
      WEFT_NEED(sc, s.scales, float, m);
      WEFT_TRY(dev_.copy_to_device(sc, scales.data(), scales.size() * sizeof(float)));
      WEFT_TRY(k.scale_rows(dlogits, sc, m, vocab));
    }
    WEFT_TRY(k.linear_backward(xc, out_w, dlogits, m, d, vocab, dxc, out_g, false));
    WEFT_TRY(dev_.ops().scatter_rows(dxc, rid, m, d, dxn));
    // The ids and targets buffers are reused by the next chunk: wait for this one's kernels.
    WEFT_TRY(dev_.synchronize());
  }
  float* dx = nullptr;
  WEFT_NEED(dx, s.dx, float, n* d);
  WEFT_TRY(k.fill(dx, n * d, 0.0f));
  WEFT_TRY(k.rms_norm_backward(s.x.get<float>(),
                               s.value[static_cast<size_t>(layout_.out_norm)].get<float>(),
                               s.rstd_final.get<float>(), dxn, n, d, dx,
                               s.grad[static_cast<size_t>(layout_.out_norm)].get<float>()));
  float* x_out = nullptr;
  WEFT_NEED(x_out, s.x_out, float, n* d);
  const int scratch = static_cast<int>(hp_.n_layers);
  for (int64_t il = hp_.n_layers - 1; il >= 0; --il) {
    const float* x_in = s.layers[static_cast<size_t>(il)].x_in.get<float>();
    if (recompute_) {
      WEFT_TRY(layer_forward(il, x_in, scratch, x_out));
      WEFT_TRY(layer_backward(il, scratch, x_in, dx));
    } else {
      WEFT_TRY(layer_backward(il, static_cast<int>(il), x_in, dx));
    }
  }
  return k.embedding_backward(dx, s.tokens.get<int32_t>(), n, d,
                              s.grad[static_cast<size_t>(layout_.embd)].get<float>());
}

result<loss_sum> device_trainer::forward_backward(std::span<const train_batch* const> batches,
                                                  const token_objective<float>* objective,
                                                  std::vector<parameter<float>>& params,
                                                  bool upload_params) {
  WEFT_TRY(prepare(params, upload_params));
  loss_sum loss;
  for (const train_batch* b : batches) WEFT_TRY(accumulate(*b, objective, loss));
  if (resident_) return loss;
  // The device's gradients into the host's (added: micro-batches accumulate).
  for (size_t i = 0; i < params.size(); ++i) {
    auto& p = params[i];
    s_->staging.resize(p.grad.size());
    WEFT_TRY(dev_.copy_to_host(s_->staging.data(), s_->grad[i].get<float>(),
                               p.grad.size() * sizeof(float)));
    WEFT_TRY(dev_.synchronize());
    const float* src = s_->staging.data();
    float* dst = p.grad.data();
    const auto cnt = static_cast<int64_t>(p.grad.size());
    const int threads =
        cnt >= (1 << 20) ? static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) : 1;
    parallel_ranges(cnt, threads, [src, dst](int64_t lo, int64_t hi) {
      for (int64_t j = lo; j < hi; ++j) dst[j] += src[j];
    });
  }
  return loss;
}

status device_trainer::prepare(std::vector<parameter<float>>& params, bool upload_params) {
  if (dev_.training() == nullptr)
    return status{status_code::unsupported,
                  dev_.capabilities().name + " has no trainer ops (device::training)"};
  if (upload_params || s_->value.size() != params.size()) WEFT_TRY(upload(params));
  if (!resident_ || zero_pending_) {
    for (size_t i = 0; i < params.size(); ++i)
      WEFT_TRY(dev_.training()->fill(s_->grad[i].get<float>(), params[i].size(), 0.0f));
    zero_pending_ = false;
  }
  return {};
}

result<std::vector<float>> device_trainer::logits(const train_batch& b,
                                                  const std::vector<parameter<float>>& params,
                                                  bool upload_params) {
  if (dev_.training() == nullptr)
    return status{status_code::unsupported,
                  dev_.capabilities().name + " has no trainer ops (device::training)"};
  if (upload_params || s_->value.size() != params.size()) WEFT_TRY(upload(params));
  WEFT_TRY(forward(b));
  const int64_t n = s_->n, vocab = hp_.n_vocab;
  float* lg = nullptr;
  WEFT_NEED(lg, s_->logits, float, n* vocab);
  WEFT_TRY(dev_.training()->linear_forward(
      s_->xn_final.get<float>(), s_->value[static_cast<size_t>(layout_.output)].get<float>(), n,
      hp_.n_embd, vocab, lg));
  std::vector<float> out(static_cast<size_t>(n * vocab));
  WEFT_TRY(dev_.copy_to_host(out.data(), lg, out.size() * sizeof(float)));
  WEFT_TRY(dev_.synchronize());
  return out;
}

status device_trainer::pull_gradients(std::vector<parameter<float>>& params) {
  if (s_->grad.size() != params.size())
    return {status_code::internal, "no gradients on the device yet"};
  for (size_t i = 0; i < params.size(); ++i)
    WEFT_TRY(dev_.copy_to_host(params[i].grad.data(), s_->grad[i].get<float>(),
                               params[i].grad.size() * sizeof(float)));
  return dev_.synchronize();
}

status device_trainer::push_gradients(const std::vector<parameter<float>>& params) {
  if (s_->grad.size() != params.size())
    return {status_code::internal, "no gradients on the device yet"};
  for (size_t i = 0; i < params.size(); ++i)
    WEFT_TRY(dev_.copy_to_device(s_->grad[i].get<float>(), params[i].grad.data(),
                                 params[i].grad.size() * sizeof(float)));
  zero_pending_ = false;
  return dev_.synchronize();
}

result<std::vector<std::span<float>>> device_trainer::gradient_buffers(
    std::vector<parameter<float>>& params, bool upload_params) {
  WEFT_TRY(prepare(params, upload_params));
  WEFT_TRY(dev_.synchronize());
  std::vector<std::span<float>> out;
  for (size_t i = 0; i < params.size(); ++i)
    out.emplace_back(s_->grad[i].get<float>(), params[i].grad.size());
  return out;
}

result<double> device_trainer::optimizer_step(adamw& opt, std::span<const uint8_t> decay,
                                              float grad_scale, double max_norm, double lr,
                                              int64_t step) {
  state& s = *s_;
  train_kernels* k = dev_.training();
  const size_t n = s.value.size();
  if (!resident_ || n == 0 || s.grad.size() != n || opt.n_tensors() != n)
    return status{status_code::internal,
                  "optimizer_step needs resident mode, a forward_backward first and one moment "
                  "pair per parameter"};
  std::vector<int64_t> sizes(n);
  for (size_t i = 0; i < n; ++i) sizes[i] = static_cast<int64_t>(opt.m(i).size());
  if (!moments_on_device_) {
    s.m.resize(n);
    s.v.resize(n);
    for (size_t i = 0; i < n; ++i) {
      float *m = nullptr, *v = nullptr;
      WEFT_NEED(m, s.m[i], float, sizes[i]);
      WEFT_NEED(v, s.v[i], float, sizes[i]);
      WEFT_TRY(dev_.copy_to_device(m, opt.m(i).data(), opt.m(i).size() * sizeof(float)));
      WEFT_TRY(dev_.copy_to_device(v, opt.v(i).data(), opt.v(i).size() * sizeof(float)));
    }
    moments_on_device_ = true;
  }
  // The host path's order: scale to the mean, the norm (double, tensors in order), clip, AdamW.
  for (size_t i = 0; i < n; ++i) WEFT_TRY(k->scale(s.grad[i].get<float>(), sizes[i], grad_scale));
  double* acc = nullptr;
  WEFT_NEED(acc, s.norm_acc, double, 1);
  double ss = 0.0;
  WEFT_TRY(dev_.copy_to_device(acc, &ss, sizeof ss));
  for (size_t i = 0; i < n; ++i) WEFT_TRY(k->sum_squares(s.grad[i].get<float>(), sizes[i], acc));
  WEFT_TRY(dev_.copy_to_host(&ss, acc, sizeof ss));
  WEFT_TRY(dev_.synchronize());
  const double norm = std::sqrt(ss);
  if (!std::isfinite(norm)) return non_finite_norm(step);
  if (const float coef = clip_factor(norm, max_norm); coef != 1.0f) {
    for (size_t i = 0; i < n; ++i) WEFT_TRY(k->scale(s.grad[i].get<float>(), sizes[i], coef));
  }
  const adamw_scalars sc = opt.scalars(opt.steps() + 1, lr);
  for (size_t i = 0; i < n; ++i) {
    const bool wd = i < decay.size() ? decay[i] != 0 : true;
    WEFT_TRY(k->adamw_update(s.value[i].get<float>(), s.grad[i].get<float>(), s.m[i].get<float>(),
                             s.v[i].get<float>(), sizes[i], wd, sc));
  }
  opt.set_steps(opt.steps() + 1);
  values_newer_ = true;
  moments_newer_ = true;
  return norm;
}

status device_trainer::pull_values(std::vector<parameter<float>>& params) {
  if (!values_newer_) return {};
  for (size_t i = 0; i < params.size(); ++i)
    WEFT_TRY(dev_.copy_to_host(params[i].value.data(), s_->value[i].get<float>(),
                               params[i].value.size() * sizeof(float)));
  WEFT_TRY(dev_.synchronize());
  values_newer_ = false;
  return {};
}

status device_trainer::pull_moments(adamw& opt) {
  if (!moments_newer_) return {};
  for (size_t i = 0; i < opt.n_tensors(); ++i) {
    WEFT_TRY(
        dev_.copy_to_host(opt.m(i).data(), s_->m[i].get<float>(), opt.m(i).size() * sizeof(float)));
    WEFT_TRY(
        dev_.copy_to_host(opt.v(i).data(), s_->v[i].get<float>(), opt.v(i).size() * sizeof(float)));
  }
  WEFT_TRY(dev_.synchronize());
  moments_newer_ = false;
  return {};
}

#undef WEFT_NEED
#undef WEFT_TRY

}  // namespace weft::gpu::train
