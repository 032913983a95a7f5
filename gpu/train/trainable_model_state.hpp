#pragma once
/// trainable_model's private state (its forward activations, backward buffers and parallel
/// shares), shared by the translation units that implement it (trainable_model.cpp and
/// trainable_model_moe.cpp). Not part of the public interface.

#include <algorithm>
#include <span>
#include <vector>

#include "gpu/train/moe_ops.hpp"
#include "gpu/train/train_ops.hpp"
#include "gpu/train/trainable_model.hpp"

namespace weft::gpu::train {

/// `v` resized to `count` elements; its data.
template <class T>
T* sized(std::vector<T>& v, int64_t count) {
  v.resize(static_cast<size_t>(count));
  return v.data();
}

/// Indices into params_ of one block's weights: the dense FFN's gate/up/down, or (MoE) the router
/// and the experts' stacked [expert][rows][cols] tensors; the other kind's are −1.
template <class T>
struct trainable_model<T>::layer_params {
  int attn_norm, wq, wk, wv, wo, ffn_norm;
  int gate = -1, up = -1, down = -1;
  int router = -1, gate_exps = -1, up_exps = -1, down_exps = -1;
};

/// What one block's backward needs from its forward. MoE: gate/up/h hold one row per routed
/// (token, slot) pair, in moe_routing's expert-major order.
template <class T>
struct trainable_model<T>::layer_acts {
  std::vector<T> x_in, xn1, rstd1, q, k, v, att, lse, x_mid, xn2, rstd2, gate, up, h;
  moe_routing<T> route;
  std::vector<T> exp_in, exp_out;  ///< [rows][d]: the gathered inputs and the experts' outputs.
};

/// One forward pass: the batch's geometry and every layer's saved activations.
template <class T>
struct trainable_model<T>::forward_state {
  int64_t n = 0;
  const train_batch* batch = nullptr;
  rope_table rope;
  attention_shape shape;
  std::vector<layer_acts> layers;  ///< All of them, or (recompute) only x_in of each.
  layer_acts scratch;              ///< The layer being recomputed (recompute).
  std::vector<T> x_final, xn_final, rstd_final;
  moe_balance<T> balance;       ///< MoE: the batch's routing, for the balance loss.
  std::vector<T> balance_grad;  ///< scale · ∂aux/∂p per expert (empty: no balance loss).
  int64_t routes_forced = 0, routes_differ = 0;  ///< Routing replay (take_routing_stats).
};

/// Buffers of the backward, kept between calls (no page faults on every step).
template <class T>
struct trainable_model<T>::backward_scratch {
  std::vector<T> dh, dgate, dup, dxn, datt, dq, dk, dv;  ///< One layer's.
  std::vector<T> dexp_out, dexp_in, dweights, droute;    ///< One MoE layer's.
  std::vector<T> dx, dxn_final, x_out;                   ///< The whole batch's.
  std::vector<T> xc, logits, dlogits, dxc;               ///< One output-head chunk's.
};

/// The gradient buffers a backward pass writes (one per parameter) and which of them are still
/// "fresh": zero by definition since zero_grad, but not cleared in memory. The first GEMM into a
/// fresh buffer overwrites it (beta 0: BLAS ignores what C held); code that adds into one (norm
/// weights, embedding rows, an expert's slice) clears it first. So zero_grad costs nothing and a
/// step writes each gradient once less; settle clears whatever no pass touched.
template <class T>
struct trainable_model<T>::grad_sink {
  std::vector<T*> data;
  std::vector<int64_t> size;
  std::vector<uint8_t>* fresh = nullptr;  ///< The owner's flags, one per parameter.

  /// For a GEMM that writes all of tensor i: its buffer, and the beta that GEMM must use.
  T* gemm_into(int i, T& beta) {
    uint8_t& f = (*fresh)[static_cast<size_t>(i)];
    beta = f != 0 ? T(0) : T(1);
    f = 0;
    return data[static_cast<size_t>(i)];
  }
  /// For code that adds into tensor i (or a part of it): its buffer, cleared first if fresh.
  T* add_into(int i) {
    uint8_t& f = (*fresh)[static_cast<size_t>(i)];
    if (f != 0) std::fill_n(data[static_cast<size_t>(i)], size[static_cast<size_t>(i)], T(0));
    f = 0;
    return data[static_cast<size_t>(i)];
  }
  /// Clears the buffers of `which` still fresh.
  void settle(std::span<const int> which) {
    for (const int i : which) {
      if ((*fresh)[static_cast<size_t>(i)] == 0) continue;
      std::fill_n(data[static_cast<size_t>(i)], size[static_cast<size_t>(i)], T(0));
      (*fresh)[static_cast<size_t>(i)] = 0;
    }
  }
  /// Clears every buffer still fresh (on `threads` threads for the large ones).
  void settle(int threads) {
    for (size_t i = 0; i < data.size(); ++i) {
      if ((*fresh)[i] == 0) continue;
      T* g = data[i];
      parallel_ranges(size[i], size[i] >= (1 << 20) ? threads : 1,
                      [g](int64_t lo, int64_t hi) { std::fill(g + lo, g + hi, T(0)); });
      (*fresh)[i] = 0;
    }
  }
};

/// Share j >= 1 of a parallel forward_backward: its own activations, scratch and gradients.
template <class T>
struct trainable_model<T>::replica {
  forward_state fs;
  backward_scratch bs;
  std::vector<std::vector<T>> grads;
  std::vector<uint8_t> fresh;  ///< grad_sink's flags for `grads`.
};

}  // namespace weft::gpu::train
