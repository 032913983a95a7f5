#include <cublas_v2.h>

#include <algorithm>
#include <cmath>

#include "gpu/cuda/common.cuh"
#include "gpu/cuda/train_ops.cuh"

namespace weft::gpu::cuda {

using namespace internal;

namespace {

constexpr unsigned kBlock = 256;
constexpr int kMaxPerLane = 8;  // head_dim <= 32 * 8

__device__ inline float sigmoidf(float v) {
  return 1.0f / (1.0f + expf(-v));
}

// ---- RMSNorm

__global__ void rms_forward(const float* x, const float* g, int64_t d, float eps, float* y,
                            float* rstd) {
  __shared__ double sh[32];
  const float* xr = x + blockIdx.x * d;
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) ss += double(xr[i]) * xr[i];
  ss = block_sum(ss, sh);
  const float r = static_cast<float>(1.0 / sqrt(ss / double(d) + double(eps)));
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) y[blockIdx.x * d + i] = xr[i] * r * g[i];
}

__global__ void rms_backward_dx(const float* x, const float* g, const float* rstd, const float* dy,
                                int64_t d, float* dx) {
  __shared__ double sh[32];
  const int64_t t = blockIdx.x;
  const float* xr = x + t * d;
  const float* dyr = dy + t * d;
  const float r = rstd[t];
  double dot = 0.0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) dot += double(dyr[i]) * g[i] * xr[i];
  dot = block_sum(dot, sh);
  const float c = static_cast<float>(dot * r * r * r / double(d));
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
    dx[t * d + i] += dyr[i] * g[i] * r - xr[i] * c;
}

// dg[i] += Σ_t dy[t][i]·x[t][i]·rstd[t], rows in order (as the CPU reference).
__global__ void rms_backward_dg(const float* x, const float* rstd, const float* dy, int64_t n,
                                int64_t d, float* dg) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= d) return;
  float acc = dg[i];
  for (int64_t t = 0; t < n; ++t) acc += dy[t * d + i] * x[t * d + i] * rstd[t];
  dg[i] = acc;
}

// ---- RoPE with a precomputed table

__global__ void rope_table_apply(float* x, int64_t n, int64_t heads, int64_t head_dim,
                                 const double* cos, const double* sin, int64_t n_dims, int style,
                                 bool inverse) {
  const int64_t half = n_dims / 2;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * heads * half) return;
  const int64_t i = idx % half;
  const int64_t h = (idx / half) % heads;
  const int64_t t = idx / (half * heads);
  const float c = static_cast<float>(cos[t * half + i]);
  const float s = static_cast<float>(inverse ? -sin[t * half + i] : sin[t * half + i]);
  float* v = x + (t * heads + h) * head_dim;
  const int64_t a = style == 0 ? 2 * i : i;
  const int64_t b = style == 0 ? 2 * i + 1 : i + half;
  const float x0 = v[a], x1 = v[b];
  v[a] = x0 * c - x1 * s;
  v[b] = x0 * s + x1 * c;
}

// ---- Attention over packed sequences (one warp per (token, head) or (key row, kv head))

/// The sequence holding token t: the largest s with starts[s] <= t.
__device__ inline int64_t sequence_of(const int64_t* starts, int64_t n_seqs, int64_t t) {
  int64_t lo = 0, hi = n_seqs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (starts[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

/// Calls f(r) for every key row token t sees, in the CPU reference's order: its sequence's prefix
/// rows, then its own rows up to t.
template <class F>
__device__ inline void for_each_key(const train_attention_args& a, int64_t t, F&& f) {
  const int64_t si = sequence_of(a.starts, a.n_seqs, t);
  const int64_t p = a.prefix != nullptr ? a.prefix[si] : -1;
  if (p >= 0)
    for (int64_t r = a.starts[p]; r < a.starts[p + 1]; ++r) f(r);
  for (int64_t r = a.starts[si]; r <= t; ++r) f(r);
}

__device__ inline void load_row(const float* src, int64_t hd, int lane, float (&r)[kMaxPerLane]) {
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int64_t c = lane + 32 * i;
    r[i] = c < hd ? src[c] : 0.0f;
  }
}

__device__ inline float row_dot(const float (&a)[kMaxPerLane], const float* b, int64_t hd,
                                int lane) {
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int64_t c = lane + 32 * i;
    if (c < hd) s += a[i] * b[c];
  }
  return warp_sum(s);
}

__global__ void attention_fwd(train_attention_args a, float* out, float* lse) {
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= a.n_tokens * a.n_heads) return;
  const int64_t t = w / a.n_heads, h = w % a.n_heads;
  const int64_t hd = a.head_dim, qd = a.n_heads * hd, kvd = a.n_kv_heads * hd;
  const int64_t g = h / (a.n_heads / a.n_kv_heads);
  float q[kMaxPerLane], acc[kMaxPerLane] = {};
  load_row(a.q + t * qd + h * hd, hd, lane, q);
  float m = -INFINITY, l = 0.0f;
  for_each_key(a, t, [&](int64_t r) {
    const float s = a.scale * row_dot(q, a.k + r * kvd + g * hd, hd, lane);
    const float m2 = fmaxf(m, s);
    const float corr = expf(m - m2);
    const float p = expf(s - m2);
    l = l * corr + p;
    const float* vr = a.v + r * kvd + g * hd;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int64_t c = lane + 32 * i;
      if (c < hd) acc[i] = acc[i] * corr + p * vr[c];
    }
    m = m2;
  });
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int64_t c = lane + 32 * i;
    if (c < hd) out[t * qd + h * hd + c] = acc[i] / l;
  }
  if (lane == 0) lse[t * a.n_heads + h] = m + logf(l);
}

// D[t][h] = Σ_c dO·O.
__global__ void attention_bwd_rowdot(train_attention_args a, float* d) {
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= a.n_tokens * a.n_heads) return;
  const int64_t t = w / a.n_heads, h = w % a.n_heads;
  const int64_t hd = a.head_dim, off = t * a.n_heads * hd + h * hd;
  double s = 0.0;
  for (int64_t c = lane; c < hd; c += 32) s += double(a.dout[off + c]) * a.out[off + c];
  s = warp_sum(s);
  if (lane == 0) d[w] = static_cast<float>(s);
}

// dQ[t][h] = scale · Σ_r dS_tr · K_r.
__global__ void attention_bwd_dq(train_attention_args a, const float* d, float* dq) {
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= a.n_tokens * a.n_heads) return;
  const int64_t t = w / a.n_heads, h = w % a.n_heads;
  const int64_t hd = a.head_dim, qd = a.n_heads * hd, kvd = a.n_kv_heads * hd;
  const int64_t g = h / (a.n_heads / a.n_kv_heads);
  float q[kMaxPerLane], dout[kMaxPerLane], acc[kMaxPerLane] = {};
  load_row(a.q + t * qd + h * hd, hd, lane, q);
  load_row(a.dout + t * qd + h * hd, hd, lane, dout);
  const float l = a.lse[w], dt = d[w];
  for_each_key(a, t, [&](int64_t r) {
    const float* kr = a.k + r * kvd + g * hd;
    const float p = expf(a.scale * row_dot(q, kr, hd, lane) - l);
    const float dp = row_dot(dout, a.v + r * kvd + g * hd, hd, lane);
    const float ds = p * (dp - dt);
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int64_t c = lane + 32 * i;
      if (c < hd) acc[i] += ds * kr[c];
    }
  });
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int64_t c = lane + 32 * i;
    if (c < hd) dq[t * qd + h * hd + c] = a.scale * acc[i];
  }
}

// dK[r][g] = scale · Σ dS · Q and dV[r][g] = Σ P · dO over the queries that see row r (the later
// tokens of its sequence, then every token of each sequence that has it as prefix) and the heads
// of group g, in a fixed order.
__global__ void attention_bwd_dkdv(train_attention_args a, const float* d, float* dk, float* dv) {
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= a.n_tokens * a.n_kv_heads) return;
  const int64_t r = w / a.n_kv_heads, g = w % a.n_kv_heads;
  const int64_t hd = a.head_dim, qd = a.n_heads * hd, kvd = a.n_kv_heads * hd;
  const int64_t group = a.n_heads / a.n_kv_heads;
  float k[kMaxPerLane], v[kMaxPerLane], dk_acc[kMaxPerLane] = {}, dv_acc[kMaxPerLane] = {};
  load_row(a.k + r * kvd + g * hd, hd, lane, k);
  load_row(a.v + r * kvd + g * hd, hd, lane, v);
  auto query = [&](int64_t t) {
    for (int64_t j = 0; j < group; ++j) {
      const int64_t h = g * group + j;
      const float* qt = a.q + t * qd + h * hd;
      const float* dot = a.dout + t * qd + h * hd;
      const float p = expf(a.scale * row_dot(k, qt, hd, lane) - a.lse[t * a.n_heads + h]);
      const float dp = row_dot(v, dot, hd, lane);
      const float ds = p * (dp - d[t * a.n_heads + h]);
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) {
        const int64_t c = lane + 32 * i;
        if (c < hd) {
          dv_acc[i] += p * dot[c];
          dk_acc[i] += ds * qt[c];
        }
      }
    }
  };
  const int64_t sr = sequence_of(a.starts, a.n_seqs, r);
  for (int64_t t = r; t < a.starts[sr + 1]; ++t) query(t);
  if (a.prefix != nullptr) {
    for (int64_t s = 0; s < a.n_seqs; ++s) {
      if (a.prefix[s] != sr) continue;
      for (int64_t t = a.starts[s]; t < a.starts[s + 1]; ++t) query(t);
    }
  }
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int64_t c = lane + 32 * i;
    if (c < hd) {
      dk[r * kvd + g * hd + c] = a.scale * dk_acc[i];
      dv[r * kvd + g * hd + c] = dv_acc[i];
    }
  }
}

// ---- SwiGLU

__global__ void swiglu_fwd(const float* gate, const float* up, int64_t n, float* h) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) h[i] = gate[i] * sigmoidf(gate[i]) * up[i];
}

__global__ void swiglu_bwd(const float* gate, const float* up, const float* dh, int64_t n,
                           float* dgate, float* dup) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float s = sigmoidf(gate[i]);
  dup[i] = dh[i] * gate[i] * s;
  dgate[i] = dh[i] * up[i] * s * (1.0f + gate[i] * (1.0f - s));
}

// ---- Cross-entropy (one block per row)

__global__ void cross_entropy_rows(const float* logits, const int32_t* targets, int64_t vocab,
                                   float grad_scale, float* dlogits, double* logp) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  const int64_t t = blockIdx.x;
  const float* row = logits + t * vocab;
  const int32_t target = targets[t];
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) mx = fmaxf(mx, row[j]);
  mx = block_max(mx, shf);
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) sum += exp(double(row[j] - mx));
  sum = block_sum(sum, shd);
  const double log_z = double(mx) + log(sum);
  const bool valid = target >= 0 && target < vocab;
  if (threadIdx.x == 0) logp[t] = valid ? double(row[target]) - log_z : nan("");
  if (dlogits == nullptr) return;
  float* drow = dlogits + t * vocab;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
    drow[j] = grad_scale * static_cast<float>(exp(double(row[j]) - log_z));
  __syncthreads();
  if (threadIdx.x == 0 && valid) drow[target] -= grad_scale;
}

__global__ void fill_values(float* x, int64_t n, float value) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = value;
}

__global__ void embedding_bwd(const float* dx, const int32_t* tokens, int64_t n, int64_t d,
                              float* dembd) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= d) return;
  for (int64_t t = 0; t < n; ++t) dembd[static_cast<int64_t>(tokens[t]) * d + i] += dx[t * d + i];
}

__global__ void scale_rows_kernel(float* x, const float* scales, int64_t rows, int64_t width) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows * width) x[i] *= scales[i / width];
}

// ---- Mixture of experts

__global__ void moe_combine_kernel(const float* exp_out, const int32_t* slot_row,
                                   const float* weights, int64_t n, int64_t k, int64_t d,
                                   float* y) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * d) return;
  const int64_t t = idx / d, i = idx % d;
  float acc = 0.0f;
  for (int64_t j = 0; j < k; ++j)
    acc += weights[t * k + j] * exp_out[static_cast<int64_t>(slot_row[t * k + j]) * d + i];
  y[idx] = acc;
}

__global__ void moe_combine_bwd(const float* dy, const float* exp_out, const int32_t* row_token,
                                const int32_t* row_slot, const float* weights, int64_t d,
                                float* dout, float* dweights) {
  __shared__ float sh[32];
  const int64_t r = blockIdx.x;
  const float* dyt = dy + static_cast<int64_t>(row_token[r]) * d;
  const float* o = exp_out + r * d;
  const float w = weights[row_slot[r]];
  float dot = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    dout[r * d + i] = w * dyt[i];
    dot += dyt[i] * o[i];
  }
  dot = block_sum(dot, sh);
  if (threadIdx.x == 0) dweights[row_slot[r]] = dot;
}

// ---- The optimizer

__global__ void scale_kernel(float* x, int64_t n, float factor) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= factor;
}

// Block b sums the squares of elements b, b + blocks·256, ... (grid-stride) into partial[b].
__global__ void sum_squares_partial(const float* x, int64_t n, double* partial) {
  __shared__ double sh[32];
  double ss = 0.0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    ss += double(x[i]) * x[i];
  ss = block_sum(ss, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = ss;
}

// *acc += the partial sums, in order (one thread).
__global__ void sum_squares_finish(const double* partial, int blocks, double* acc) {
  double ss = *acc;
  for (int b = 0; b < blocks; ++b) ss += partial[b];
  *acc = ss;
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n, bool decay,
                             adamw_args s) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  float pj = p[j];
  const float gj = __fmul_rn(__fmul_rn(g[j], s.grad_scale), s.clip);
  if (decay) pj *= s.keep;
  const float mj = s.beta1 * m[j] + (1.0f - s.beta1) * gj;
  const float vj = s.beta2 * v[j] + (1.0f - s.beta2) * gj * gj;
  m[j] = mj;
  v[j] = vj;
  p[j] = pj - s.step_size * mj / (sqrtf(vj) / s.sqrt_bc2 + s.eps);
}

int last_error() {
  return static_cast<int>(cudaGetLastError());
}

int blas_status(cublasStatus_t r) {
  return r == CUBLAS_STATUS_SUCCESS ? 0 : 1000 + static_cast<int>(r);
}

}  // namespace

int launch_linear_forward(const float* x, const float* w, int64_t n, int64_t in, int64_t out,
                          float* y, blas_handle blas) {
  if (n == 0) return 0;
  // Row-major y[n][out] = x[n][in]·Wᵀ  <=>  column-major Y(out, n) = Wᵀ(out, in)·X(in, n).
  const float one = 1.0f, zero = 0.0f;
  return blas_status(cublasSgemm(static_cast<cublasHandle_t>(blas), CUBLAS_OP_T, CUBLAS_OP_N,
                                 static_cast<int>(out), static_cast<int>(n), static_cast<int>(in),
                                 &one, w, static_cast<int>(in), x, static_cast<int>(in), &zero, y,
                                 static_cast<int>(out)));
}

int launch_linear_backward(const float* x, const float* w, const float* dy, int64_t n, int64_t in,
                           int64_t out, float* dx, float* dw, bool add_dx, blas_handle blas) {
  if (n == 0) return 0;
  auto h = static_cast<cublasHandle_t>(blas);
  const float one = 1.0f, zero = 0.0f;
  if (dx != nullptr) {
    // dx[n][in] = dy[n][out]·W[out][in]  <=>  DX(in, n) = W(in, out)·DY(out, n).
    const int r = blas_status(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(in),
                                          static_cast<int>(n), static_cast<int>(out), &one, w,
                                          static_cast<int>(in), dy, static_cast<int>(out),
                                          add_dx ? &one : &zero, dx, static_cast<int>(in)));
    if (r != 0) return r;
  }
  if (dw != nullptr) {
    // dw[out][in] += dyᵀ·x  <=>  DW(in, out) += X(in, n)·DY(out, n)ᵀ.
    return blas_status(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(in),
                                   static_cast<int>(out), static_cast<int>(n), &one, x,
                                   static_cast<int>(in), dy, static_cast<int>(out), &one, dw,
                                   static_cast<int>(in)));
  }
  return 0;
}

int launch_rms_norm_forward(const float* x, const float* g, int64_t n, int64_t d, float eps,
                            float* y, float* rstd, stream_handle s) {
  if (n == 0) return 0;
  rms_forward<<<static_cast<unsigned>(n), kBlock, 0, static_cast<cudaStream_t>(s)>>>(x, g, d, eps,
                                                                                     y, rstd);
  return last_error();
}

int launch_rms_norm_backward(const float* x, const float* g, const float* rstd, const float* dy,
                             int64_t n, int64_t d, float* dx, float* dg, stream_handle s) {
  if (n == 0) return 0;
  auto st = static_cast<cudaStream_t>(s);
  rms_backward_dx<<<static_cast<unsigned>(n), kBlock, 0, st>>>(x, g, rstd, dy, d, dx);
  rms_backward_dg<<<grid_for(d, kBlock), kBlock, 0, st>>>(x, rstd, dy, n, d, dg);
  return last_error();
}

int launch_train_rope(float* x, int64_t n, int64_t heads, int64_t head_dim, const double* cos,
                      const double* sin, int64_t n_dims, int style, bool inverse, stream_handle s) {
  const int64_t total = n * heads * (n_dims / 2);
  if (total == 0) return 0;
  rope_table_apply<<<grid_for(total, kBlock), kBlock, 0, static_cast<cudaStream_t>(s)>>>(
      x, n, heads, head_dim, cos, sin, n_dims, style, inverse);
  return last_error();
}

int launch_train_attention_forward(const train_attention_args& a, float* out, float* lse,
                                   float* /*scratch*/, stream_handle s) {
  if (a.head_dim > 32 * kMaxPerLane) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t warps = a.n_tokens * a.n_heads;
  if (warps == 0) return 0;
  attention_fwd<<<grid_for(warps * 32, 128), 128, 0, static_cast<cudaStream_t>(s)>>>(a, out, lse);
  return last_error();
}

int launch_train_attention_backward(const train_attention_args& a, float* dq, float* dk, float* dv,
                                    float* scratch, stream_handle s) {
  if (a.head_dim > 32 * kMaxPerLane) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t warps = a.n_tokens * a.n_heads;
  if (warps == 0) return 0;
  auto st = static_cast<cudaStream_t>(s);
  attention_bwd_rowdot<<<grid_for(warps * 32, 128), 128, 0, st>>>(a, scratch);
  attention_bwd_dq<<<grid_for(warps * 32, 128), 128, 0, st>>>(a, scratch, dq);
  const int64_t kv_warps = a.n_tokens * a.n_kv_heads;
  attention_bwd_dkdv<<<grid_for(kv_warps * 32, 128), 128, 0, st>>>(a, scratch, dk, dv);
  return last_error();
}

int launch_swiglu_forward(const float* gate, const float* up, int64_t n, float* h,
                          stream_handle s) {
  if (n == 0) return 0;
  swiglu_fwd<<<grid_for(n, kBlock), kBlock, 0, static_cast<cudaStream_t>(s)>>>(gate, up, n, h);
  return last_error();
}

int launch_swiglu_backward(const float* gate, const float* up, const float* dh, int64_t n,
                           float* dgate, float* dup, stream_handle s) {
  if (n == 0) return 0;
  swiglu_bwd<<<grid_for(n, kBlock), kBlock, 0, static_cast<cudaStream_t>(s)>>>(gate, up, dh, n,
                                                                               dgate, dup);
  return last_error();
}

int launch_cross_entropy(const float* logits, const int32_t* targets, int64_t n, int64_t vocab,
                         float grad_scale, float* dlogits, double* logp, stream_handle s) {
  if (n == 0) return 0;
  cross_entropy_rows<<<static_cast<unsigned>(n), kBlock, 0, static_cast<cudaStream_t>(s)>>>(
      logits, targets, vocab, grad_scale, dlogits, logp);
  return last_error();
}

int launch_fill(float* x, int64_t n, float value, stream_handle s) {
  if (n == 0) return 0;
  fill_values<<<grid_for(n, kBlock), kBlock, 0, static_cast<cudaStream_t>(s)>>>(x, n, value);
  return last_error();
}

int launch_embedding_backward(const float* dx, const int32_t* tokens, int64_t n, int64_t d,
                              float* dembd, stream_handle s) {
  if (n == 0 || d == 0) return 0;
  embedding_bwd<<<grid_for(d, 128), 128, 0, static_cast<cudaStream_t>(s)>>>(dx, tokens, n, d,
                                                                            dembd);
  return last_error();
}

int launch_scale_rows(float* x, const float* scales, int64_t rows, int64_t width, stream_handle s) {
  if (rows * width == 0) return 0;
  scale_rows_kernel<<<grid_for(rows * width, kBlock), kBlock, 0, static_cast<cudaStream_t>(s)>>>(
      x, scales, rows, width);
  return last_error();
}

int launch_moe_combine(const float* exp_out, const int32_t* slot_row, const float* weights,
                       int64_t n, int64_t k, int64_t d, float* y, stream_handle s) {
  if (n * d == 0) return 0;
  moe_combine_kernel<<<grid_for(n * d, kBlock), kBlock, 0, static_cast<cudaStream_t>(s)>>>(
      exp_out, slot_row, weights, n, k, d, y);
  return last_error();
}

int launch_moe_combine_backward(const float* dy, const float* exp_out, const int32_t* row_token,
                                const int32_t* row_slot, const float* weights, int64_t rows,
                                int64_t d, float* dout, float* dweights, stream_handle s) {
  if (rows == 0) return 0;
  moe_combine_bwd<<<static_cast<unsigned>(rows), 128, 0, static_cast<cudaStream_t>(s)>>>(
      dy, exp_out, row_token, row_slot, weights, d, dout, dweights);
  return last_error();
}

int launch_scale(float* x, int64_t n, float factor, stream_handle s) {
  if (n == 0) return 0;
  scale_kernel<<<grid_for(n, kBlock), kBlock, 0, static_cast<cudaStream_t>(s)>>>(x, n, factor);
  return last_error();
}

int launch_sum_squares(const float* x, int64_t n, double* acc, double* partial, stream_handle s) {
  if (n == 0) return 0;
  const auto blocks = static_cast<int>(
      std::min<int64_t>(kSumSquaresBlocks, (n + kBlock - 1) / static_cast<int64_t>(kBlock)));
  sum_squares_partial<<<blocks, kBlock, 0, static_cast<cudaStream_t>(s)>>>(x, n, partial);
  sum_squares_finish<<<1, 1, 0, static_cast<cudaStream_t>(s)>>>(partial, blocks, acc);
  return last_error();
}

int launch_adamw(float* p, const float* g, float* m, float* v, int64_t n, bool decay,
                 const adamw_args& a, stream_handle s) {
  if (n == 0) return 0;
  adamw_kernel<<<grid_for(n, kBlock), kBlock, 0, static_cast<cudaStream_t>(s)>>>(p, g, m, v, n,
                                                                                 decay, a);
  return last_error();
}

}  // namespace weft::gpu::cuda
