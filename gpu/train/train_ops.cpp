#include "gpu/train/train_ops.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>
#include <type_traits>

#include "gpu/cpu/elementwise.hpp"
#include "gpu/train/optimizer.hpp"

namespace weft::gpu::train {

void parallel_ranges(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& f) {
  const int64_t k = std::max<int64_t>(1, std::min<int64_t>(threads, n));
  if (k == 1) {
    if (n > 0) f(0, n);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < k; ++t)
    pool.emplace_back([&f, n, k, t] { f(n * t / k, n * (t + 1) / k); });
  f(0, n / k);
  for (auto& th : pool) th.join();
}

void parallel_tensor_ranges(std::span<const int64_t> sizes, int threads,
                            const std::function<void(size_t, int64_t, int64_t)>& f) {
  std::vector<int64_t> starts{0};
  for (const int64_t n : sizes) starts.push_back(starts.back() + n);
  parallel_ranges(starts.back(), threads, [&](int64_t lo, int64_t hi) {
    auto i = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), lo) -
                                 starts.begin() - 1);
    for (; i < sizes.size() && starts[i] < hi; ++i) {
      const int64_t a = std::max(lo, starts[i]) - starts[i];
      const int64_t b = std::min(hi, starts[i + 1]) - starts[i];
      if (b > a) f(i, a, b);
    }
  });
}

namespace {

/// Row-major GEMM C = alpha·op(A)·op(B) + beta·C for float or double.
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  const auto ta = trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
                beta, c, static_cast<int>(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
                beta, c, static_cast<int>(ldc));
  }
}

template <class T>
T sigmoid(T v) {
  return T(1) / (T(1) + std::exp(-v));
}

}  // namespace

template <class T>
void linear_forward(const T* x, const T* w, int64_t n, int64_t in, int64_t out, T* y) {
  if (n == 0) return;
  gemm<T>(false, true, n, out, in, T(1), x, in, w, in, T(0), y, out);
}

template <class T>
void linear_backward(const T* x, const T* w, const T* dy, int64_t n, int64_t in, int64_t out, T* dx,
                     T* dw, bool add_dx, T dw_beta) {
  if (n == 0) return;
  if (dx != nullptr)
    gemm<T>(false, false, n, in, out, T(1), dy, out, w, in, add_dx ? T(1) : T(0), dx, in);
  if (dw != nullptr) gemm<T>(true, false, out, in, n, T(1), dy, out, x, in, dw_beta, dw, in);
}

template <class T>
void rms_norm_forward(const T* x, const T* g, int64_t n, int64_t d, T eps, T* y, T* rstd) {
  for (int64_t t = 0; t < n; ++t) {
    const T* xr = x + t * d;
    double ss = 0.0;
    if constexpr (std::is_same_v<T, float>) {
      ss = sum_squares(xr, d);  // vectorised, in double
    } else {
      for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    }
    const T r = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
    rstd[t] = r;
    for (int64_t i = 0; i < d; ++i) y[t * d + i] = xr[i] * r * g[i];
  }
}

template <class T>
void rms_norm_backward(const T* x, const T* g, const T* rstd, const T* dy, int64_t n, int64_t d,
                       T* dx, T* dg) {
  // y_i = x_i·r·g_i with r = (mean(x²) + eps)^−½; ∂r/∂x_j = −r³·x_j / d.
  for (int64_t t = 0; t < n; ++t) {
    const T* xr = x + t * d;
    const T* dyr = dy + t * d;
    const T r = rstd[t];
    // Σ_i dy_i·g_i·x_i in double, element i in lane i % 8 (a loop the compiler vectorises).
    double lanes[8] = {};
    int64_t i0 = 0;
    for (; i0 + 8 <= d; i0 += 8) {
      for (int64_t l = 0; l < 8; ++l)
        lanes[l] += static_cast<double>(dyr[i0 + l]) * g[i0 + l] * xr[i0 + l];
    }
    for (; i0 < d; ++i0) lanes[i0 % 8] += static_cast<double>(dyr[i0]) * g[i0] * xr[i0];
    const double dot = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
                       ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
    const T c = static_cast<T>(dot * r * r * r / static_cast<double>(d));
    for (int64_t i = 0; i < d; ++i) {
      dx[t * d + i] += dyr[i] * g[i] * r - xr[i] * c;
      dg[i] += dyr[i] * xr[i] * r;
    }
  }
}

rope_table make_rope_table(std::span<const int32_t> positions, const rope_config& config) {
  rope_table t;
  t.n_dims = config.n_dims;
  const int64_t half = config.n_dims / 2;
  t.cos.resize(positions.size() * static_cast<size_t>(half));
  t.sin.resize(t.cos.size());
  for (size_t p = 0; p < positions.size(); ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double inv_freq =
          std::pow(static_cast<double>(config.freq_base),
                   -2.0 * static_cast<double>(i) / static_cast<double>(config.n_dims));
      double theta = static_cast<double>(positions[p]) * inv_freq;
      if (config.freq_factors != nullptr) theta /= config.freq_factors[i];
      theta *= config.freq_scale;
      t.cos[p * static_cast<size_t>(half) + static_cast<size_t>(i)] = std::cos(theta);
      t.sin[p * static_cast<size_t>(half) + static_cast<size_t>(i)] = std::sin(theta);
    }
  }
  return t;
}

template <class T>
void rope_apply(T* x, int64_t n, int64_t heads, int64_t head_dim, const rope_table& table,
                rope_style style, bool inverse) {
  const int64_t half = table.n_dims / 2;
  for (int64_t t = 0; t < n; ++t) {
    const double* cs = table.cos.data() + t * half;
    const double* sn = table.sin.data() + t * half;
    for (int64_t h = 0; h < heads; ++h) {
      T* v = x + (t * heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const T c = static_cast<T>(cs[i]);
        const T s = static_cast<T>(inverse ? -sn[i] : sn[i]);
        const int64_t a = style == rope_style::normal ? 2 * i : i;
        const int64_t b = style == rope_style::normal ? 2 * i + 1 : i + table.n_dims / 2;
        const T x0 = v[a];
        const T x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
      }
    }
  }
}

namespace {

/// The keys and values one sequence attends to: its prefix's rows (if any) then its own, gathered
/// into contiguous buffers when there is a prefix, else pointed to in place.
template <class T>
struct attention_span {
  const T* k = nullptr;
  const T* v = nullptr;
  int64_t stride = 0;  ///< Row stride of k and v.
  int64_t prefix = 0;  ///< Rows of the prefix (the causal mask is offset by it).
  int64_t keys = 0;    ///< prefix + own rows.
  std::vector<T> kbuf, vbuf;

  void gather(const T* k_all, const T* v_all, int64_t kvd, const packed_sequences& seqs,
              int64_t si) {
    const int64_t start = seqs.starts[static_cast<size_t>(si)];
    const int64_t len = seqs.length(si);
    const int64_t p = seqs.prefix_of(si);
    if (p < 0) {
      k = k_all + start * kvd;
      v = v_all + start * kvd;
      stride = kvd;
      prefix = 0;
      keys = len;
      return;
    }
    const int64_t pstart = seqs.starts[static_cast<size_t>(p)];
    prefix = seqs.length(p);
    keys = prefix + len;
    kbuf.resize(static_cast<size_t>(keys * kvd));
    vbuf.resize(kbuf.size());
    std::copy(k_all + pstart * kvd, k_all + (pstart + prefix) * kvd, kbuf.begin());
    std::copy(k_all + start * kvd, k_all + (start + len) * kvd, kbuf.begin() + prefix * kvd);
    std::copy(v_all + pstart * kvd, v_all + (pstart + prefix) * kvd, vbuf.begin());
    std::copy(v_all + start * kvd, v_all + (start + len) * kvd, vbuf.begin() + prefix * kvd);
    k = kbuf.data();
    v = vbuf.data();
    stride = kvd;
  }
};

}  // namespace

template <class T>
void attention_forward(const T* q, const T* k, const T* v, const packed_sequences& seqs,
                       const attention_shape& shape, T* out, T* lse) {
  const int64_t hd = shape.head_dim;
  const int64_t qd = shape.n_heads * hd;
  const int64_t kvd = shape.n_kv_heads * hd;
  const int64_t group = shape.n_heads / shape.n_kv_heads;
  std::vector<T> s;
  attention_span<T> span;
  for (int64_t si = 0; si < seqs.n_seqs(); ++si) {
    const int64_t start = seqs.starts[static_cast<size_t>(si)];
    const int64_t len = seqs.length(si);
    if (len == 0) continue;
    span.gather(k, v, kvd, seqs, si);
    const int64_t keys = span.keys, off = span.prefix;
    s.resize(static_cast<size_t>(len * keys));
    for (int64_t h = 0; h < shape.n_heads; ++h) {
      const int64_t g = h / group;
      const T* qh = q + start * qd + h * hd;
      const T* kg = span.k + g * hd;
      const T* vg = span.v + g * hd;
      gemm<T>(false, true, len, keys, hd, static_cast<T>(shape.scale), qh, qd, kg, span.stride,
              T(0), s.data(), keys);
      for (int64_t i = 0; i < len; ++i) {
        T* row = s.data() + i * keys;
        const int64_t last = off + i;  // the last key query i sees
        T mx = row[0];
        for (int64_t j = 1; j <= last; ++j) mx = std::max(mx, row[j]);
        double sum = 0.0;
        if constexpr (std::is_same_v<T, float>) {
          sum = cpu::exp_scaled_below(row, row, last + 1, mx, 1.0f);  // vectorised
        } else {
          for (int64_t j = 0; j <= last; ++j) sum += (row[j] = std::exp(row[j] - mx));
        }
        const T inv = static_cast<T>(1.0 / sum);
        for (int64_t j = 0; j <= last; ++j) row[j] *= inv;
        std::fill(row + last + 1, row + keys, T(0));
        lse[(start + i) * shape.n_heads + h] = mx + static_cast<T>(std::log(sum));
      }
      gemm<T>(false, false, len, hd, keys, T(1), s.data(), keys, vg, span.stride, T(0),
              out + start * qd + h * hd, qd);
    }
  }
}

template <class T>
void attention_backward(const T* q, const T* k, const T* v, const T* out, const T* lse,
                        const T* dout, const packed_sequences& seqs, const attention_shape& shape,
                        T* dq, T* dk, T* dv) {
  const int64_t hd = shape.head_dim;
  const int64_t qd = shape.n_heads * hd;
  const int64_t kvd = shape.n_kv_heads * hd;
  const int64_t group = shape.n_heads / shape.n_kv_heads;
  const T scale = static_cast<T>(shape.scale);
  std::fill(dk, dk + seqs.n_tokens() * kvd, T(0));
  std::fill(dv, dv + seqs.n_tokens() * kvd, T(0));
  std::vector<T> p, dp, dkbuf, dvbuf;
  attention_span<T> span;
  for (int64_t si = 0; si < seqs.n_seqs(); ++si) {
    const int64_t start = seqs.starts[static_cast<size_t>(si)];
    const int64_t len = seqs.length(si);
    if (len == 0) continue;
    span.gather(k, v, kvd, seqs, si);
    const int64_t keys = span.keys, off = span.prefix;
    // dK and dV of the keys: in place for a sequence without a prefix, else in buffers that are
    // added to the prefix's rows and the sequence's own afterwards.
    T* dks = dk + start * kvd;
    T* dvs = dv + start * kvd;
    if (off > 0) {
      dkbuf.assign(static_cast<size_t>(keys * kvd), T(0));
      dvbuf.assign(dkbuf.size(), T(0));
      dks = dkbuf.data();
      dvs = dvbuf.data();
    }
    p.resize(static_cast<size_t>(len * keys));
    dp.resize(p.size());
    for (int64_t h = 0; h < shape.n_heads; ++h) {
      const int64_t g = h / group;
      const T* qh = q + start * qd + h * hd;
      const T* kg = span.k + g * hd;
      const T* vg = span.v + g * hd;
      const T* oh = out + start * qd + h * hd;
      const T* doh = dout + start * qd + h * hd;
      // P recomputed from the scores and the forward's log-sum-exp.
      gemm<T>(false, true, len, keys, hd, scale, qh, qd, kg, span.stride, T(0), p.data(), keys);
      for (int64_t i = 0; i < len; ++i) {
        T* row = p.data() + i * keys;
        const T l = lse[(start + i) * shape.n_heads + h];
        if constexpr (std::is_same_v<T, float>) {
          cpu::exp_scaled_below(row, row, off + i + 1, l, 1.0f);
        } else {
          for (int64_t j = 0; j <= off + i; ++j) row[j] = std::exp(row[j] - l);
        }
        std::fill(row + off + i + 1, row + keys, T(0));
      }
      // dV += Pᵀ·dO ; dP = dO·Vᵀ.
      gemm<T>(true, false, keys, hd, len, T(1), p.data(), keys, doh, qd, T(1), dvs + g * hd, kvd);
      gemm<T>(false, true, len, keys, hd, T(1), doh, qd, vg, span.stride, T(0), dp.data(), keys);
      // dS = P ∘ (dP − rowsum(dO ∘ O)).
      for (int64_t i = 0; i < len; ++i) {
        double di = 0.0;
        for (int64_t c = 0; c < hd; ++c)
          di += static_cast<double>(doh[i * qd + c]) * oh[i * qd + c];
        T* prow = p.data() + i * keys;
        const T* dprow = dp.data() + i * keys;
        for (int64_t j = 0; j <= off + i; ++j) prow[j] *= dprow[j] - static_cast<T>(di);
      }
      // dQ = scale·dS·K ; dK += scale·dSᵀ·Q.
      gemm<T>(false, false, len, hd, keys, scale, p.data(), keys, kg, span.stride, T(0),
              dq + start * qd + h * hd, qd);
      gemm<T>(true, false, keys, hd, len, scale, p.data(), keys, qh, qd, T(1), dks + g * hd, kvd);
    }
    if (off > 0) {
      const int64_t pstart = seqs.starts[static_cast<size_t>(seqs.prefix_of(si))];
      for (int64_t r = 0; r < keys; ++r) {
        const int64_t row = r < off ? pstart + r : start + (r - off);
        T* dkr = dk + row * kvd;
        T* dvr = dv + row * kvd;
        const T* sk = dkbuf.data() + r * kvd;
        const T* sv = dvbuf.data() + r * kvd;
        for (int64_t c = 0; c < kvd; ++c) {
          dkr[c] += sk[c];
          dvr[c] += sv[c];
        }
      }
    }
  }
}

template <class T>
void swiglu_forward(const T* gate, const T* up, int64_t n, T* h) {
  if constexpr (std::is_same_v<T, float>) {
    cpu::silu_mul_forward(gate, up, h, n);  // vectorised
  } else {
    for (int64_t i = 0; i < n; ++i) h[i] = gate[i] * sigmoid(gate[i]) * up[i];
  }
}

template <class T>
void swiglu_backward(const T* gate, const T* up, const T* dh, int64_t n, T* dgate, T* dup) {
  if constexpr (std::is_same_v<T, float>) {
    cpu::silu_mul_backward(gate, up, dh, dgate, dup, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const T s = sigmoid(gate[i]);
    const T silu = gate[i] * s;
    dup[i] = dh[i] * silu;
    dgate[i] = dh[i] * up[i] * s * (T(1) + gate[i] * (T(1) - s));
  }
}

template <class T>
double cross_entropy(const T* logits, const int32_t* targets, int64_t n, int64_t vocab,
                     T grad_scale, T* dlogits, T* logp) {
  double total = 0.0;
  for (int64_t t = 0; t < n; ++t) {
    const T* row = logits + t * vocab;
    const T mx = *std::max_element(row, row + vocab);
    T* drow = dlogits != nullptr ? dlogits + t * vocab : nullptr;
    double sum = 0.0;
    if constexpr (std::is_same_v<T, float>) {
      // Vectorised e^(x − max) in float, summed in double, kept in dlogits to be scaled below.
      sum = cpu::exp_scaled_below(row, drow, vocab, mx, 1.0f);
    } else {
      for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(row[j] - mx));
    }
    const double log_z = static_cast<double>(mx) + std::log(sum);
    const double lp = static_cast<double>(row[targets[t]]) - log_z;
    total -= lp;
    if (logp != nullptr) logp[t] = static_cast<T>(lp);
    if constexpr (std::is_same_v<T, float>) {
      if (drow != nullptr) {
        const auto f = static_cast<float>(static_cast<double>(grad_scale) / sum);
        for (int64_t j = 0; j < vocab; ++j) drow[j] *= f;
        drow[targets[t]] -= grad_scale;
      }
    } else if (dlogits != nullptr) {
      for (int64_t j = 0; j < vocab; ++j) {
        drow[j] = grad_scale * static_cast<T>(std::exp(static_cast<double>(row[j]) - log_z));
      }
      drow[targets[t]] -= grad_scale;
    }
  }
  return total;
}

#define WEFT_TRAIN_OPS(T)                                                                          \
  template void linear_forward<T>(const T*, const T*, int64_t, int64_t, int64_t, T*);              \
  template void linear_backward<T>(const T*, const T*, const T*, int64_t, int64_t, int64_t, T*,    \
                                   T*, bool, T);                                                   \
  template void rms_norm_forward<T>(const T*, const T*, int64_t, int64_t, T, T*, T*);              \
  template void rms_norm_backward<T>(const T*, const T*, const T*, const T*, int64_t, int64_t, T*, \
                                     T*);                                                          \
  template void rope_apply<T>(T*, int64_t, int64_t, int64_t, const rope_table&, rope_style, bool); \
  template void attention_forward<T>(const T*, const T*, const T*, const packed_sequences&,        \
                                     const attention_shape&, T*, T*);                              \
  template void attention_backward<T>(const T*, const T*, const T*, const T*, const T*, const T*,  \
                                      const packed_sequences&, const attention_shape&, T*, T*,     \
                                      T*);                                                         \
  template void swiglu_forward<T>(const T*, const T*, int64_t, T*);                                \
  template void swiglu_backward<T>(const T*, const T*, const T*, int64_t, T*, T*);                 \
  template double cross_entropy<T>(const T*, const int32_t*, int64_t, int64_t, T, T*, T*);

WEFT_TRAIN_OPS(float)
WEFT_TRAIN_OPS(double)
#undef WEFT_TRAIN_OPS

}  // namespace weft::gpu::train
