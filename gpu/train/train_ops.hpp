#pragma once
/// Forward and backward of every op of the Llama-family block, on host memory, for training
/// (docs/training.md). The reference CPU backend of the trainer: plain loops and BLAS GEMMs, no
/// CAF, no device. Templated on the scalar: `float` for training (f32 master weights, f32 math)
/// and `double` for the gradient checks against central finite differences.
///
/// Layouts are row-major: activations [n_tokens][width]; a weight matrix W is [out][in] as GGUF
/// stores it (ne[0] = in), so a linear layer computes y = x·Wᵀ. Backward functions *add* into the
/// weight gradients (gradient accumulation over micro-batches) and say for each input gradient
/// whether they overwrite or add.

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "gpu/compute_ops.hpp"

namespace weft::gpu::train {

/// Runs f(begin, end) over [0, n) cut into `threads` contiguous ranges, one thread each (the
/// caller's thread takes the first). For element-wise passes, whose results do not depend on it.
void parallel_ranges(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& f);

/// parallel_ranges over several tensors as one run of elements (tensor i has sizes[i]): each
/// thread's range is cut at the tensors' ends and f(i, begin, end) runs on each piece, so many
/// small tensors share the threads as well as one large one.
void parallel_tensor_ranges(std::span<const int64_t> sizes, int threads,
                            const std::function<void(size_t, int64_t, int64_t)>& f);

/// y[n][out] = x[n][in]·Wᵀ.
template <class T>
void linear_forward(const T* x, const T* w, int64_t n, int64_t in, int64_t out, T* y);

/// dx[n][in] (+)= dy·W (added when `add_dx`, else overwritten); dw[out][in] = dw_beta·dw + dyᵀ·x
/// (dw_beta 1 adds; 0 overwrites whatever dw held, NaN included). `dx` or `dw` may be null to skip
/// it.
template <class T>
void linear_backward(const T* x, const T* w, const T* dy, int64_t n, int64_t in, int64_t out, T* dx,
                     T* dw, bool add_dx = false, T dw_beta = T(1));

/// y = x / rms(x) * g per row; rstd[n] keeps 1 / rms for the backward.
template <class T>
void rms_norm_forward(const T* x, const T* g, int64_t n, int64_t d, T eps, T* y, T* rstd);

/// dx += ∂/∂x, dg += ∂/∂g for upstream dy.
template <class T>
void rms_norm_backward(const T* x, const T* g, const T* rstd, const T* dy, int64_t n, int64_t d,
                       T* dx, T* dg);

/// The cos/sin of every (position, pair) the batch needs, computed in double.
struct rope_table {
  int64_t n_dims = 0;
  std::vector<double> cos, sin;  ///< [n_tokens][n_dims / 2]
};

/// Builds the table for the tokens' positions (`config.freq_factors`, when set, is host memory).
rope_table make_rope_table(std::span<const int32_t> positions, const rope_config& config);

/// Rotates every head of x[n][heads * head_dim] in place, as the engine does (ggml's "normal"
/// adjacent-pair or "neox" half-split style). `inverse` rotates by −θ: the backward of the
/// rotation.
template <class T>
void rope_apply(T* x, int64_t n, int64_t heads, int64_t head_dim, const rope_table& table,
                rope_style style, bool inverse);

/// Sequences packed back to back in one batch: sequence s holds tokens [starts[s], starts[s+1]).
/// Tokens attend causally within their own sequence only (no padding).
///
/// Shared prefixes: when `prefix` is not empty, prefix[s] >= 0 names an earlier sequence whose
/// tokens sequence s sees in front of its own (its positions continue after them), as if each
/// such s were that prefix followed by s, computed once: the samples of a GRPO group share their
/// prompt. A prefix sequence has no prefix of its own.
struct packed_sequences {
  std::vector<int64_t> starts{0};
  std::vector<int64_t> prefix;  ///< Empty, or one entry per sequence (−1: none).
  int64_t n_tokens() const { return starts.back(); }
  int64_t n_seqs() const { return static_cast<int64_t>(starts.size()) - 1; }
  int64_t length(int64_t s) const {
    return starts[static_cast<size_t>(s) + 1] - starts[static_cast<size_t>(s)];
  }
  /// The sequence sequence s continues, or −1.
  int64_t prefix_of(int64_t s) const {
    return prefix.empty() ? -1 : prefix[static_cast<size_t>(s)];
  }
  /// Position of sequence s's first token (the length of its prefix).
  int64_t first_position(int64_t s) const {
    const int64_t p = prefix_of(s);
    return p < 0 ? 0 : length(p);
  }
};

/// Shape of grouped-query attention.
struct attention_shape {
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  double scale = 0.0;  ///< Usually 1 / sqrt(head_dim).
};

/// Causal grouped-query attention over packed sequences: out[n][heads * hd] from
/// q[n][heads * hd], k/v[n][kv_heads * hd]. lse[n][heads] keeps each row's log-sum-exp so the
/// backward recomputes the probabilities instead of storing them.
template <class T>
void attention_forward(const T* q, const T* k, const T* v, const packed_sequences& seqs,
                       const attention_shape& shape, T* out, T* lse);

/// Overwrites dq, dk, dv.
template <class T>
void attention_backward(const T* q, const T* k, const T* v, const T* out, const T* lse,
                        const T* dout, const packed_sequences& seqs, const attention_shape& shape,
                        T* dq, T* dk, T* dv);

/// h = silu(gate) · up, elementwise over n values.
template <class T>
void swiglu_forward(const T* gate, const T* up, int64_t n, T* h);

/// Overwrites dgate and dup.
template <class T>
void swiglu_backward(const T* gate, const T* up, const T* dh, int64_t n, T* dgate, T* dup);

/// Cross-entropy of rows of logits[n][vocab] against targets[n]. Returns the summed −log p of the
/// targets; logp[i] (when non-null) gets each row's log-probability of its target. When `dlogits`
/// is non-null it is overwritten with grad_scale · (softmax − onehot).
template <class T>
double cross_entropy(const T* logits, const int32_t* targets, int64_t n, int64_t vocab,
                     T grad_scale, T* dlogits, T* logp);

}  // namespace weft::gpu::train
