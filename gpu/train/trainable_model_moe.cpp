/// trainable_model's mixture-of-experts feed-forward: routing (optionally replayed), the experts'
/// GEMMs over their contiguous rows, the mixing, and their backward (docs/training.md,
/// "Mixture-of-experts models"; the ops are in moe_ops.hpp).

#include <algorithm>

#include "gpu/train/moe_ops.hpp"
#include "gpu/train/trainable_model_state.hpp"

namespace weft::gpu::train {

template <class T>
void trainable_model<T>::moe_forward(const layer_params& l, int64_t il, const forward_state& fs,
                                     int64_t n, layer_acts& a, T* y) {
  const int64_t d = hp_.n_embd;
  const int64_t ne = hp_.n_experts;
  const int64_t eff = moe_ff_;
  auto w = [&](int i) { return params_[static_cast<size_t>(i)].value.data(); };
  std::vector<T> logits(static_cast<size_t>(n * ne));
  linear_forward(a.xn2.data(), w(l.router), n, d, ne, logits.data());
  moe_routing<T>& r = a.route;
  const train_batch& b = *fs.batch;
  const int64_t k = hp_.n_experts_used;
  if (b.routes.empty()) {
    moe_route(logits.data(), n, ne, k, r);
  } else {
    moe_route(logits.data(), n, ne, k, r, b.routes.data() + il * k, b.route_width,
              static_cast<int64_t>(b.routes.size()) / b.route_width);
  }
  const int64_t rows = r.rows();
  a.exp_in.resize(static_cast<size_t>(rows * d));
  for (int64_t i = 0; i < rows; ++i)
    std::copy_n(a.xn2.begin() + r.row_token[static_cast<size_t>(i)] * d, d,
                a.exp_in.begin() + i * d);
  a.gate.resize(static_cast<size_t>(rows * eff));
  a.up.resize(a.gate.size());
  a.h.resize(a.gate.size());
  a.exp_out.resize(static_cast<size_t>(rows * d));
  r.for_each_expert([&](int64_t e, int64_t r0, int64_t m) {
    linear_forward(a.exp_in.data() + r0 * d, w(l.gate_exps) + e * eff * d, m, d, eff,
                   a.gate.data() + r0 * eff);
    linear_forward(a.exp_in.data() + r0 * d, w(l.up_exps) + e * eff * d, m, d, eff,
                   a.up.data() + r0 * eff);
  });
  swiglu_forward(a.gate.data(), a.up.data(), rows * eff, a.h.data());
  r.for_each_expert([&](int64_t e, int64_t r0, int64_t m) {
    linear_forward(a.h.data() + r0 * eff, w(l.down_exps) + e * d * eff, m, eff, d,
                   a.exp_out.data() + r0 * d);
  });
  moe_combine(a.exp_out.data(), r.slot_row.data(), r.weights.data(), n, r.k, d, y);
}

template <class T>
void trainable_model<T>::moe_backward(const layer_params& l, int64_t n, backward_scratch& b,
                                      grad_sink& grads, const layer_acts& a, const T* dy, T* dxn,
                                      const std::vector<T>& balance_grad) {
  const int64_t d = hp_.n_embd;
  const int64_t ne = hp_.n_experts;
  const int64_t eff = moe_ff_;
  const moe_routing<T>& r = a.route;
  const int64_t rows = r.rows();
  auto w = [&](int i) { return params_[static_cast<size_t>(i)].value.data(); };
  // An expert's gradient is a slice of its stacked tensor: added into, the tensor cleared first
  // when zero_grad marked it (grad_sink).
  auto g = [&](int i) { return grads.add_into(i); };
  T* dout = sized(b.dexp_out, rows * d);
  T* dw = sized(b.dweights, rows);
  moe_combine_backward(dy, a.exp_out.data(), r.row_token.data(), r.row_slot.data(),
                       r.weights.data(), rows, d, dout, dw);
  T* dh = sized(b.dh, rows * eff);
  T* dgate = sized(b.dgate, rows * eff);
  T* dup = sized(b.dup, rows * eff);
  T* din = sized(b.dexp_in, rows * d);
  r.for_each_expert([&](int64_t e, int64_t r0, int64_t m) {
    linear_backward(a.h.data() + r0 * eff, w(l.down_exps) + e * d * eff, dout + r0 * d, m, eff, d,
                    dh + r0 * eff, g(l.down_exps) + e * d * eff);
  });
  swiglu_backward(a.gate.data(), a.up.data(), dh, rows * eff, dgate, dup);
  r.for_each_expert([&](int64_t e, int64_t r0, int64_t m) {
    linear_backward(a.exp_in.data() + r0 * d, w(l.gate_exps) + e * eff * d, dgate + r0 * eff, m, d,
                    eff, din + r0 * d, g(l.gate_exps) + e * eff * d);
    linear_backward(a.exp_in.data() + r0 * d, w(l.up_exps) + e * eff * d, dup + r0 * eff, m, d, eff,
                    din + r0 * d, g(l.up_exps) + e * eff * d, true);
  });
  // Each row's input gradient back to its token, rows in order.
  std::fill(dxn, dxn + n * d, T(0));
  for (int64_t i = 0; i < rows; ++i) {
    T* dst = dxn + static_cast<int64_t>(r.row_token[static_cast<size_t>(i)]) * d;
    for (int64_t c = 0; c < d; ++c) dst[c] += din[i * d + c];
  }
  T* dl = sized(b.droute, n * ne);
  moe_router_backward(r, dw, dl);
  if (!balance_grad.empty()) moe_balance_backward(r, balance_grad, dl);
  linear_backward(a.xn2.data(), w(l.router), dl, n, d, ne, dxn, g(l.router), true);
}

#define WEFT_MOE_MEMBERS(T)                                                                       \
  template void trainable_model<T>::moe_forward(const layer_params&, int64_t,                     \
                                                const forward_state&, int64_t, layer_acts&, T*);  \
  template void trainable_model<T>::moe_backward(const layer_params&, int64_t, backward_scratch&, \
                                                 grad_sink&, const layer_acts&, const T*, T*,     \
                                                 const std::vector<T>&);
WEFT_MOE_MEMBERS(float)
WEFT_MOE_MEMBERS(double)
#undef WEFT_MOE_MEMBERS

}  // namespace weft::gpu::train
