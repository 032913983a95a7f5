#pragma once
/// The trainer's mixture-of-experts feed-forward (docs/training.md), Mixtral's as llama.cpp and
/// the serving engine run it: router logits → softmax over the experts → the k most probable
/// (ties to the lower index) → their probabilities renormalised to sum to one; the block's output
/// is Σ_j w_j · expert_j(x). Routing is tiny ([tokens][experts]) and runs on the host for every
/// backend; the mixing and its backward are train_kernels ops (these functions are the CPU
/// reference), the experts' GEMMs are linear ops on each expert's rows.
///
/// Rows: every routed (token, slot) pair, in expert-major order (tokens in order within an
/// expert), so each expert's rows are contiguous and its GEMMs take them at once.

#include <cstdint>
#include <vector>

namespace weft::gpu::train {

template <class T>
struct moe_routing {
  int64_t n = 0, k = 0, n_experts = 0;
  std::vector<T> weights;             ///< [n][k] renormalised weights, most probable first.
  std::vector<int32_t> chosen;        ///< [n][k] the chosen experts.
  std::vector<int32_t> row_token;     ///< [rows] the token of each row.
  std::vector<int32_t> row_slot;      ///< [rows] its slot (token · k + j).
  std::vector<int32_t> slot_row;      ///< [n][k] the row of each slot.
  std::vector<int64_t> expert_start;  ///< [experts + 1] expert e's rows: [start[e], start[e + 1]).
  int64_t rows() const { return n * k; }
};

/// Routes n tokens from their router logits [n][n_experts] (overwritten with the probabilities).
template <class T>
void moe_route(T* logits, int64_t n, int64_t n_experts, int64_t k, moe_routing<T>& r);

/// y[t] = Σ_j weights[t][j] · exp_out[slot_row[t][j]] (rows of d), j in order; overwrites y.
template <class T>
void moe_combine(const T* exp_out, const int32_t* slot_row, const T* weights, int64_t n, int64_t k,
                 int64_t d, T* y);

/// moe_combine's backward, per row r (token t = row_token[r], slot s = row_slot[r]):
/// dout[r] = weights[s] · dy[t] and dweights[s] = dy[t] · exp_out[r]; overwrites both.
template <class T>
void moe_combine_backward(const T* dy, const T* exp_out, const int32_t* row_token,
                          const int32_t* row_slot, const T* weights, int64_t rows, int64_t d,
                          T* dout, T* dweights);

/// The router's gradient from ∂L/∂weights: w_j = exp(l_j) / Σ_{i chosen} exp(l_i), so
/// ∂L/∂l_j = w_j (∂L/∂w_j − Σ_i w_i ∂L/∂w_i) for a chosen expert and 0 for the others (the choice
/// is piecewise constant). Overwrites dlogits [n][n_experts].
template <class T>
void moe_router_backward(const moe_routing<T>& r, const T* dweights, T* dlogits);

}  // namespace weft::gpu::train
