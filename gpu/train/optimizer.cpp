#include "gpu/train/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "gpu/train/train_ops.hpp"

#if defined(__AVX2__) && defined(__FMA__)
#include "gpu/cpu/simd.hpp"
#endif

namespace weft::gpu::train {

namespace {

// One element of adamw_update_range, in the order its comment fixes.
inline void adamw_one(float& p, float g_in, float& m, float& v, bool decay, const adamw_scalars& s,
                      float c1, float c2) {
  const float g = (g_in * s.grad_scale) * s.clip;
  if (decay) p *= s.keep;
  m = std::fma(s.beta1, m, c1 * g);
  v = std::fma(s.beta2, v, (c2 * g) * g);
  p -= (s.step_size * m) / (std::sqrt(v) / s.sqrt_bc2 + s.eps);
}

}  // namespace

void adamw_update_range(float* p, const float* g, float* m, float* v, int64_t lo, int64_t hi,
                        bool decay, const adamw_scalars& s) {
  const float c1 = 1.0f - s.beta1;
  const float c2 = 1.0f - s.beta2;
  int64_t j = lo;
#if defined(__AVX512F__)
  const __m512 keep = _mm512_set1_ps(s.keep), b1 = _mm512_set1_ps(s.beta1),
               b2 = _mm512_set1_ps(s.beta2), vc1 = _mm512_set1_ps(c1), vc2 = _mm512_set1_ps(c2),
               step = _mm512_set1_ps(s.step_size), bc2 = _mm512_set1_ps(s.sqrt_bc2),
               eps = _mm512_set1_ps(s.eps), gscale = _mm512_set1_ps(s.grad_scale),
               clip = _mm512_set1_ps(s.clip);
  for (; j + 16 <= hi; j += 16) {
    __m512 pv = _mm512_loadu_ps(p + j);
    if (decay) pv = _mm512_mul_ps(pv, keep);
    const __m512 gv = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(g + j), gscale), clip);
    const __m512 mv = _mm512_fmadd_ps(b1, _mm512_loadu_ps(m + j), _mm512_mul_ps(vc1, gv));
    const __m512 vv =
        _mm512_fmadd_ps(b2, _mm512_loadu_ps(v + j), _mm512_mul_ps(_mm512_mul_ps(vc2, gv), gv));
    const __m512 den = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vv), bc2), eps);
    pv = _mm512_sub_ps(pv, _mm512_div_ps(_mm512_mul_ps(step, mv), den));
    _mm512_storeu_ps(m + j, mv);
    _mm512_storeu_ps(v + j, vv);
    _mm512_storeu_ps(p + j, pv);
  }
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 keep = _mm256_set1_ps(s.keep), b1 = _mm256_set1_ps(s.beta1),
               b2 = _mm256_set1_ps(s.beta2), vc1 = _mm256_set1_ps(c1), vc2 = _mm256_set1_ps(c2),
               step = _mm256_set1_ps(s.step_size), bc2 = _mm256_set1_ps(s.sqrt_bc2),
               eps = _mm256_set1_ps(s.eps), gscale = _mm256_set1_ps(s.grad_scale),
               clip = _mm256_set1_ps(s.clip);
  for (; j + 8 <= hi; j += 8) {
    __m256 pv = _mm256_loadu_ps(p + j);
    if (decay) pv = _mm256_mul_ps(pv, keep);
    const __m256 gv = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(g + j), gscale), clip);
    const __m256 mv = _mm256_fmadd_ps(b1, _mm256_loadu_ps(m + j), _mm256_mul_ps(vc1, gv));
    const __m256 vv =
        _mm256_fmadd_ps(b2, _mm256_loadu_ps(v + j), _mm256_mul_ps(_mm256_mul_ps(vc2, gv), gv));
    const __m256 den = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vv), bc2), eps);
    pv = _mm256_sub_ps(pv, _mm256_div_ps(_mm256_mul_ps(step, mv), den));
    _mm256_storeu_ps(m + j, mv);
    _mm256_storeu_ps(v + j, vv);
    _mm256_storeu_ps(p + j, pv);
  }
#endif
  for (; j < hi; ++j) adamw_one(p[j], g[j], m[j], v[j], decay, s, c1, c2);
}

namespace {

constexpr int64_t squares_chunk = int64_t{1} << 16;

// One chunk of sum_squares: element i in lane i % 8, FMA chains, then the fixed tree.
double sum_squares_chunk(const float* x, int64_t n, float scale) {
  double lanes[8] = {};
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512d acc = _mm512_setzero_pd();
  const __m256 sv = _mm256_set1_ps(scale);
  for (; i + 8 <= n; i += 8) {
    const __m512d d = _mm512_cvtps_pd(_mm256_mul_ps(_mm256_loadu_ps(x + i), sv));
    acc = _mm512_fmadd_pd(d, d, acc);
  }
  _mm512_storeu_pd(lanes, acc);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  const __m128 sv = _mm_set1_ps(scale);
  for (; i + 8 <= n; i += 8) {
    const __m256d a = _mm256_cvtps_pd(_mm_mul_ps(_mm_loadu_ps(x + i), sv));
    const __m256d b = _mm256_cvtps_pd(_mm_mul_ps(_mm_loadu_ps(x + i + 4), sv));
    lo = _mm256_fmadd_pd(a, a, lo);
    hi = _mm256_fmadd_pd(b, b, hi);
  }
  _mm256_storeu_pd(lanes, lo);
  _mm256_storeu_pd(lanes + 4, hi);
#else
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) {
      const double d = x[i + l] * scale;
      lanes[l] = std::fma(d, d, lanes[l]);
    }
  }
#endif
  for (int l = 0; i < n; ++i, ++l) {
    const double d = x[i] * scale;
    lanes[l] = std::fma(d, d, lanes[l]);
  }
  return ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
         ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
}

}  // namespace

double sum_squares(const float* x, int64_t n, int threads, float scale) {
  const int64_t chunks = (n + squares_chunk - 1) / squares_chunk;
  std::vector<double> part(static_cast<size_t>(chunks), 0.0);
  parallel_ranges(chunks, n >= (int64_t{1} << 20) ? threads : 1, [&](int64_t a, int64_t b) {
    for (int64_t c = a; c < b; ++c) {
      const int64_t lo = c * squares_chunk;
      part[static_cast<size_t>(c)] =
          sum_squares_chunk(x + lo, std::min(squares_chunk, n - lo), scale);
    }
  });
  double ss = 0.0;
  for (double p : part) ss += p;
  return ss;
}

void adamw::init(std::span<const int64_t> sizes) {
  step_ = 0;
  m_.clear();
  v_.clear();
  for (int64_t s : sizes) {
    m_.emplace_back(static_cast<size_t>(s), 0.0f);
    v_.emplace_back(static_cast<size_t>(s), 0.0f);
  }
}

adamw_scalars adamw::scalars(int64_t step, double lr) const {
  const double b1 = config_.beta1;
  const double b2 = config_.beta2;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
  adamw_scalars s;
  s.step_size = static_cast<float>(lr / bc1);
  s.sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
  s.eps = static_cast<float>(config_.eps);
  s.keep = static_cast<float>(1.0 - lr * config_.weight_decay);
  s.beta1 = static_cast<float>(b1);
  s.beta2 = static_cast<float>(b2);
  return s;
}

void adamw::step(std::span<const std::span<float>> values,
                 std::span<const std::span<const float>> grads, std::span<const uint8_t> decay,
                 double lr, float grad_scale, float clip) {
  ++step_;
  adamw_scalars sc = scalars(step_, lr);
  sc.grad_scale = grad_scale;
  sc.clip = clip;
  // All tensors as one range of elements, cut among the threads.
  std::vector<int64_t> sizes;
  for (const auto& t : values) sizes.push_back(static_cast<int64_t>(t.size()));
  parallel_tensor_ranges(sizes, config_.threads, [&](size_t i, int64_t lo, int64_t hi) {
    const bool wd = i < decay.size() ? decay[i] != 0 : true;
    adamw_update_range(values[i].data(), grads[i].data(), m_[i].data(), v_[i].data(), lo, hi, wd,
                       sc);
  });
}

double global_grad_norm(std::span<const std::span<const float>> grads, int threads, float scale) {
  // Every tensor's 64 Ki-element chunks as one list cut among the threads (most tensors are too
  // small to split on their own), then each tensor's chunks and the tensors summed in order —
  // sum_squares' bits, tensor by tensor.
  std::vector<std::pair<size_t, int64_t>> chunks;  // (tensor, first element)
  std::vector<size_t> first_chunk;
  for (size_t i = 0; i < grads.size(); ++i) {
    first_chunk.push_back(chunks.size());
    for (int64_t lo = 0; lo < static_cast<int64_t>(grads[i].size()); lo += squares_chunk)
      chunks.emplace_back(i, lo);
  }
  first_chunk.push_back(chunks.size());
  std::vector<double> part(chunks.size(), 0.0);
  parallel_ranges(static_cast<int64_t>(chunks.size()), threads, [&](int64_t a, int64_t b) {
    for (int64_t c = a; c < b; ++c) {
      const auto [i, lo] = chunks[static_cast<size_t>(c)];
      const auto n = static_cast<int64_t>(grads[i].size());
      part[static_cast<size_t>(c)] =
          sum_squares_chunk(grads[i].data() + lo, std::min(squares_chunk, n - lo), scale);
    }
  });
  double ss = 0.0;
  for (size_t i = 0; i < grads.size(); ++i) {
    double t = 0.0;
    for (size_t c = first_chunk[i]; c < first_chunk[i + 1]; ++c) t += part[c];
    ss += t;
  }
  return std::sqrt(ss);
}

result<double> scale_clip_and_update(adamw& opt, std::span<const std::span<float>> values,
                                     std::span<const std::span<const float>> grads,
                                     std::span<const uint8_t> decay, float grad_scale,
                                     double max_norm, double lr, int64_t step) {
  // The norm of the scaled gradients, without writing them.
  const double norm = global_grad_norm(grads, opt.config().threads, grad_scale);
  if (!std::isfinite(norm)) return non_finite_norm(step);
  opt.step(values, grads, decay, lr, grad_scale, clip_factor(norm, max_norm));
  return norm;
}

result<double> clip_and_update(adamw& opt, std::span<const std::span<float>> values,
                               std::span<const std::span<float>> grads,
                               std::span<const uint8_t> decay, double max_norm, double lr,
                               int64_t step) {
  std::vector<std::span<const float>> cgrads;
  for (const auto& g : grads) cgrads.emplace_back(g.data(), g.size());
  return scale_clip_and_update(opt, values, cgrads, decay, 1.0f, max_norm, lr, step);
}

double clip_grad_norm(std::span<const std::span<float>> grads, double max_norm, int threads) {
  std::vector<std::span<const float>> view(grads.begin(), grads.end());
  const double norm = global_grad_norm(view, threads);
  if (const float coef = clip_factor(norm, max_norm); coef != 1.0f) {
    for (const auto& g : grads) {
      const auto n = static_cast<int64_t>(g.size());
      parallel_ranges(n, n >= (int64_t{1} << 20) ? threads : 1, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) g[static_cast<size_t>(i)] *= coef;
      });
    }
  }
  return norm;
}

float clip_factor(double norm, double max_norm) {
  if (max_norm > 0.0 && norm > max_norm) return static_cast<float>(max_norm / (norm + 1e-6));
  return 1.0f;
}

status non_finite_norm(int64_t step) {
  return {status_code::internal, "gradient norm is not finite at step " + std::to_string(step) +
                                     " (lower --lr or check the data)"};
}

double lr_schedule::at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) {
    return peak * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  if (decay == shape::constant) return peak;
  const int64_t span = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress =
      std::clamp(static_cast<double>(step - warmup_steps) / static_cast<double>(span), 0.0, 1.0);
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return peak * (min_ratio + (1.0 - min_ratio) * cosine);
}

bool parse_lr_shape(const std::string& name, lr_schedule::shape& out) {
  if (name == "cosine") {
    out = lr_schedule::shape::cosine;
  } else if (name == "constant") {
    out = lr_schedule::shape::constant;
  } else {
    return false;
  }
  return true;
}

}  // namespace weft::gpu::train
