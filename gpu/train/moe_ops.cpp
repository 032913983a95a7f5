#include "gpu/train/moe_ops.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace weft::gpu::train {

template <class T>
void moe_route(T* logits, int64_t n, int64_t n_experts, int64_t k, moe_routing<T>& r,
               const int16_t* forced, int64_t stride, int64_t n_forced) {
  const int64_t ne = n_experts;
  r.n = n;
  r.k = k;
  r.n_experts = ne;
  r.forced = r.differ = 0;
  r.weights.resize(static_cast<size_t>(n * k));
  r.probs.clear();
  r.probs.reserve(static_cast<size_t>(n * ne));
  r.chosen.resize(static_cast<size_t>(n * k));
  std::vector<int32_t> order(static_cast<size_t>(ne));
  std::vector<int64_t> count(static_cast<size_t>(ne), 0);
  for (int64_t t = 0; t < n; ++t) {
    T* p = logits + t * ne;
    const T mx = *std::max_element(p, p + ne);
    T sum = 0;
    for (int64_t e = 0; e < ne; ++e) sum += (p[e] = std::exp(p[e] - mx));
    for (int64_t e = 0; e < ne; ++e) p[e] /= sum;
    r.probs.insert(r.probs.end(), p, p + ne);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t z) { return p[x] > p[z]; });
    if (forced != nullptr && t < n_forced && forced[t * stride] >= 0) {
      const int16_t* f = forced + t * stride;
      ++r.forced;
      bool same = true;
      for (int64_t j = 0; j < k && same; ++j)
        same = std::find(order.begin(), order.begin() + k, static_cast<int32_t>(f[j])) !=
               order.begin() + k;
      if (!same) ++r.differ;
      for (int64_t j = 0; j < k; ++j) order[static_cast<size_t>(j)] = f[j];
    }
    T wsum = 0;
    for (int64_t j = 0; j < k; ++j) wsum += p[order[static_cast<size_t>(j)]];
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = order[static_cast<size_t>(j)];
      r.weights[static_cast<size_t>(t * k + j)] = p[e] / wsum;
      r.chosen[static_cast<size_t>(t * k + j)] = e;
      ++count[static_cast<size_t>(e)];
    }
  }
  const int64_t rows = n * k;
  r.expert_start.assign(static_cast<size_t>(ne + 1), 0);
  for (int64_t e = 0; e < ne; ++e)
    r.expert_start[static_cast<size_t>(e + 1)] =
        r.expert_start[static_cast<size_t>(e)] + count[static_cast<size_t>(e)];
  std::vector<int64_t> cursor(r.expert_start.begin(), r.expert_start.end() - 1);
  r.row_token.resize(static_cast<size_t>(rows));
  r.row_slot.resize(static_cast<size_t>(rows));
  r.slot_row.resize(static_cast<size_t>(rows));
  for (int64_t s = 0; s < rows; ++s) {
    const int64_t row = cursor[static_cast<size_t>(r.chosen[static_cast<size_t>(s)])]++;
    r.row_token[static_cast<size_t>(row)] = static_cast<int32_t>(s / k);
    r.row_slot[static_cast<size_t>(row)] = static_cast<int32_t>(s);
    r.slot_row[static_cast<size_t>(s)] = static_cast<int32_t>(row);
  }
}

template <class T>
void moe_combine(const T* exp_out, const int32_t* slot_row, const T* weights, int64_t n, int64_t k,
                 int64_t d, T* y) {
  for (int64_t t = 0; t < n; ++t) {
    T* yt = y + t * d;
    std::fill(yt, yt + d, T(0));
    for (int64_t j = 0; j < k; ++j) {
      const T w = weights[t * k + j];
      const T* o = exp_out + static_cast<int64_t>(slot_row[t * k + j]) * d;
      for (int64_t i = 0; i < d; ++i) yt[i] += w * o[i];
    }
  }
}

template <class T>
void moe_combine_backward(const T* dy, const T* exp_out, const int32_t* row_token,
                          const int32_t* row_slot, const T* weights, int64_t rows, int64_t d,
                          T* dout, T* dweights) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* dyt = dy + static_cast<int64_t>(row_token[r]) * d;
    const T* o = exp_out + r * d;
    const T w = weights[row_slot[r]];
    T dot = 0;
    for (int64_t i = 0; i < d; ++i) {
      dout[r * d + i] = w * dyt[i];
      dot += dyt[i] * o[i];
    }
    dweights[row_slot[r]] = dot;
  }
}

template <class T>
void moe_router_backward(const moe_routing<T>& r, const T* dweights, T* dlogits) {
  const int64_t ne = r.n_experts, k = r.k;
  std::fill(dlogits, dlogits + r.n * ne, T(0));
  for (int64_t t = 0; t < r.n; ++t) {
    T mean = 0;
    for (int64_t j = 0; j < k; ++j)
      mean += r.weights[static_cast<size_t>(t * k + j)] * dweights[t * k + j];
    for (int64_t j = 0; j < k; ++j) {
      const auto s = static_cast<size_t>(t * k + j);
      dlogits[t * ne + r.chosen[s]] = r.weights[s] * (dweights[s] - mean);
    }
  }
}

template <class T>
void moe_balance<T>::reset(int64_t n_experts) {
  chosen_.assign(static_cast<size_t>(n_experts), 0.0);
  prob_.assign(static_cast<size_t>(n_experts), 0.0);
  pairs_ = 0;
}

template <class T>
void moe_balance<T>::add(const moe_routing<T>& r) {
  for (int32_t e : r.chosen) chosen_[static_cast<size_t>(e)] += 1.0;
  for (int64_t t = 0; t < r.n; ++t) {
    for (int64_t e = 0; e < r.n_experts; ++e)
      prob_[static_cast<size_t>(e)] += r.probs[static_cast<size_t>(t * r.n_experts + e)];
  }
  pairs_ += r.n;
}

template <class T>
double moe_balance<T>::loss() const {
  if (pairs_ == 0) return 0.0;
  const double per = 1.0 / static_cast<double>(pairs_);
  double s = 0.0;
  for (size_t e = 0; e < chosen_.size(); ++e) s += (chosen_[e] * per) * (prob_[e] * per);
  return static_cast<double>(chosen_.size()) * s;
}

template <class T>
std::vector<T> moe_balance<T>::prob_grad(double scale) const {
  std::vector<T> g(chosen_.size(), T(0));
  if (pairs_ == 0) return g;
  const double per = 1.0 / static_cast<double>(pairs_);
  for (size_t e = 0; e < g.size(); ++e)
    g[e] = static_cast<T>(scale * static_cast<double>(g.size()) * chosen_[e] * per * per);
  return g;
}

template <class T>
void moe_balance_backward(const moe_routing<T>& r, const std::vector<T>& g, T* dlogits) {
  const int64_t ne = r.n_experts;
  for (int64_t t = 0; t < r.n; ++t) {
    const T* p = r.probs.data() + t * ne;
    T dot = 0;
    for (int64_t e = 0; e < ne; ++e) dot += p[e] * g[static_cast<size_t>(e)];
    for (int64_t e = 0; e < ne; ++e)
      dlogits[t * ne + e] += p[e] * (g[static_cast<size_t>(e)] - dot);
  }
}

int64_t first_invalid_route(const int16_t* routes, int64_t n_positions, const route_shape& s) {
  const int64_t width = s.width();
  for (int64_t pos = 0; pos < n_positions; ++pos) {
    const int16_t* r = routes + pos * width;
    if (r[0] < 0) continue;
    for (int64_t at = 0; at < width; at += s.k) {
      for (int64_t j = 0; j < s.k; ++j) {
        const int16_t e = r[at + j];
        if (e < 0 || e >= s.experts || std::find(r + at, r + at + j, e) != r + at + j) return pos;
      }
    }
  }
  return -1;
}

#define WEFT_MOE_OPS(T)                                                                            \
  template void moe_route<T>(T*, int64_t, int64_t, int64_t, moe_routing<T>&, const int16_t*,       \
                             int64_t, int64_t);                                                    \
  template void moe_combine<T>(const T*, const int32_t*, const T*, int64_t, int64_t, int64_t, T*); \
  template void moe_combine_backward<T>(const T*, const T*, const int32_t*, const int32_t*,        \
                                        const T*, int64_t, int64_t, T*, T*);                       \
  template void moe_router_backward<T>(const moe_routing<T>&, const T*, T*);                       \
  template class moe_balance<T>;                                                                   \
  template void moe_balance_backward<T>(const moe_routing<T>&, const std::vector<T>&, T*);
WEFT_MOE_OPS(float)
WEFT_MOE_OPS(double)
#undef WEFT_MOE_OPS

}  // namespace weft::gpu::train
