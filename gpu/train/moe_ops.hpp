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

#include <cstddef>
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
  std::vector<T> probs;               ///< [n][experts] the router's softmax (the balance loss).
  /// Routing replay: tokens whose experts were given, and those of them whose given set differs
  /// from the router's own top-k.
  int64_t forced = 0, differ = 0;
  int64_t rows() const { return n * k; }
  /// Calls f(e, first_row, row_count) for every expert with rows, in expert order.
  template <class F>
  void for_each_expert(F&& f) const {
    for (int64_t e = 0; e < n_experts; ++e) {
      const int64_t r0 = expert_start[static_cast<size_t>(e)];
      const int64_t m = expert_start[static_cast<size_t>(e + 1)] - r0;
      if (m > 0) f(e, r0, m);
    }
  }
};

/// The shape of replayed routes (routing replay): per position, `layers` groups of `k` expert ids,
/// each group distinct and in [0, experts).
struct route_shape {
  int64_t layers = 0, experts = 0, k = 0;
  int64_t width() const { return layers * k; }
};

/// The first of n_positions positions (rows of s.width() ids) whose routes are invalid, or -1.
/// A position whose first id is negative is not given (the trainer routes it).
int64_t first_invalid_route(const int16_t* routes, int64_t n_positions, const route_shape& s);

/// Routes n tokens from their router logits [n][n_experts] (overwritten with the probabilities).
/// Routing replay: for a token t < n_forced with forced[t · stride] >= 0, the experts
/// forced[t · stride + j] (j < k, distinct, in that order) are used instead of the top-k, with the
/// router's probabilities over them renormalised as weights (so the router still trains).
template <class T>
void moe_route(T* logits, int64_t n, int64_t n_experts, int64_t k, moe_routing<T>& r,
               const int16_t* forced = nullptr, int64_t stride = 0, int64_t n_forced = 0);

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

/// The load-balancing loss of a micro-batch (Switch Transformer's, as transformers' Mixtral
/// computes it in load_balancing_loss_func): over every routed (layer, token) of the batch, F_e is
/// the share of the choices (k per token) that went to expert e and P_e the mean router probability
/// of e; aux = n_experts · Σ_e F_e · P_e (1 · k when perfectly balanced). F is piecewise constant,
/// so the gradient flows through P: ∂aux/∂p_e = n_experts · F_e / (layers · tokens), the same for
/// every token of every layer.
template <class T>
class moe_balance {
 public:
  /// Starts a new batch.
  void reset(int64_t n_experts);
  /// Adds one layer's routing (its probs and choices).
  void add(const moe_routing<T>& r);
  double loss() const;
  /// scale · ∂aux/∂p_e per expert.
  std::vector<T> prob_grad(double scale) const;

 private:
  std::vector<double> chosen_, prob_;
  int64_t pairs_ = 0;  ///< (layer, token) pairs added.
};

/// Adds the balance loss's router gradient to dlogits [n][n_experts] given g = scale · ∂aux/∂p
/// (moe_balance::prob_grad): softmax's backward, dl_e += p_e (g_e − Σ_i p_i g_i).
template <class T>
void moe_balance_backward(const moe_routing<T>& r, const std::vector<T>& g, T* dlogits);

}  // namespace weft::gpu::train
