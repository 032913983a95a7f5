#include "gpu/train/trainable_model.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>
#include <type_traits>

#include "gpu/ggml_types.hpp"
#include "gpu/train/device_trainer.hpp"
#include "gpu/train/moe_ops.hpp"
#include "gpu/train/trainable_model_state.hpp"

namespace weft::gpu::train {

void train_batch::add(std::span<const int32_t> toks, std::span<const uint8_t> in_loss) {
  const size_t n = toks.size();
  for (size_t i = 0; i < n; ++i) {
    tokens.push_back(toks[i]);
    const bool has_target = i + 1 < n && i + 1 < in_loss.size() && in_loss[i + 1] != 0;
    targets.push_back(has_target ? toks[i + 1] : -1);
  }
  seqs.starts.push_back(seqs.starts.back() + static_cast<int64_t>(n));
  if (!seqs.prefix.empty() && static_cast<int64_t>(seqs.prefix.size()) < seqs.n_seqs()) {
    seqs.prefix.push_back(-1);
  }
}

void train_batch::add(std::span<const int32_t> toks, std::span<const uint8_t> in_loss,
                      std::span<const policy_token> info, int64_t prefix) {
  policy.resize(tokens.size());
  if (prefix >= 0 && seqs.prefix.empty())
    seqs.prefix.assign(static_cast<size_t>(seqs.n_seqs()), -1);
  add(toks, in_loss);  // appends −1 to a non-empty prefix list
  if (!seqs.prefix.empty()) seqs.prefix.back() = prefix;
  for (size_t i = 0; i < toks.size(); ++i) {
    policy.push_back(i + 1 < toks.size() && i + 1 < info.size() ? info[i + 1] : policy_token{});
  }
}

int64_t train_batch::add_prefix(std::span<const int32_t> toks) {
  const std::vector<uint8_t> none(toks.size(), 0);
  const int64_t index = seqs.n_seqs();
  add(toks, none, std::span<const policy_token>{}, -1);
  return index;
}

void train_batch::set_routes(int64_t at, std::span<const uint8_t> src, int64_t width) {
  if (width <= 0) return;
  route_width = width;
  const auto n = static_cast<int64_t>(src.size()) / width;
  if (static_cast<int64_t>(routes.size()) < (at + n) * width)
    routes.resize(static_cast<size_t>((at + n) * width), int16_t{-1});
  for (int64_t i = 0; i < n * width; ++i)
    routes[static_cast<size_t>(at * width + i)] = static_cast<int16_t>(src[static_cast<size_t>(i)]);
}

double balance_weight(const train_batch& b, std::span<const int64_t> rows, bool policy) {
  if (!policy) return static_cast<double>(rows.size());
  double w = 0.0;
  for (const int64_t i : rows) {
    if (static_cast<size_t>(i) < b.policy.size()) w += b.policy[static_cast<size_t>(i)].weight;
  }
  return w;
}

int64_t train_batch::n_loss_tokens() const {
  return std::count_if(targets.begin(), targets.end(), [](int32_t t) { return t >= 0; });
}

template <class T>
trainable_model<T>::trainable_model(const model_hparams& hp, const trainable_config& config)
    : hp_(hp),
      config_(config),
      fs_(std::make_unique<forward_state>()),
      bs_(std::make_unique<backward_scratch>()) {}

template <class T>
trainable_model<T>::~trainable_model() = default;

template <class T>
result<std::unique_ptr<trainable_model<T>>> trainable_model<T>::load(
    const gguf_file& file, const trainable_config& config) {
  auto hp = read_model_hparams(file);
  if (!hp) return hp.error();
  if (config.router_aux_loss_coef < 0.0 ||
      (config.router_aux_loss_coef > 0.0 && hp->n_experts == 0)) {
    return status{status_code::invalid_argument,
                  "the router load-balancing loss needs a mixture-of-experts model and a "
                  "coefficient >= 0"};
  }
  std::unique_ptr<trainable_model> m{new trainable_model(*hp, config)};
  if (hp->n_experts > 0) {
    // The experts' hidden size is their tensors' (some families give it its own metadata key).
    const gguf_tensor* ge = file.find_tensor("blk.0.ffn_gate_exps.weight");
    if (ge == nullptr || ge->n_dims != 3 || ge->ne[2] != hp->n_experts)
      return status{status_code::bad_model,
                    "blk.0.ffn_gate_exps.weight must be [experts][ff][embd] for " +
                        std::to_string(hp->n_experts) + " experts"};
    m->moe_ff_ = ge->ne[1];
  }
  const int64_t d = hp->n_embd;
  const int64_t qd = hp->n_heads * hp->head_dim;
  const int64_t kvd = hp->n_kv_heads * hp->head_dim;
  auto& params = m->params_;
  params.reserve(static_cast<size_t>(3 + 9 * hp->n_layers));
  auto add = [&](const std::string& name, int64_t cols, int64_t rows) -> result<int> {
    const gguf_tensor* t = file.find_tensor(name);
    if (t == nullptr) return status{status_code::bad_model, "tensor '" + name + "' missing"};
    if (t->ne[0] != cols || t->n_elements != cols * rows) {
      return status{status_code::bad_model,
                    "tensor '" + name + "' has " + std::to_string(t->n_elements) +
                        " elements in rows of " + std::to_string(t->ne[0]) + ", expected [" +
                        std::to_string(rows) + "][" + std::to_string(cols) + "]"};
    }
    parameter<T> p;
    p.name = name;
    p.ne = {cols, rows};
    p.value.resize(static_cast<size_t>(cols * rows));
    p.grad.assign(p.value.size(), T(0));
    std::vector<float> row(static_cast<size_t>(cols));
    const size_t row_bytes = t->row_size_bytes();
    for (int64_t r = 0; r < rows; ++r) {
      if (dequantize_row(t->type, t->data + static_cast<size_t>(r) * row_bytes, row.data(), cols) !=
          row_status::ok) {
        return status{status_code::unsupported, "tensor '" + name + "' has type " +
                                                    std::string{type_name(t->type)} +
                                                    ", which the trainer cannot dequantize"};
      }
      std::copy(row.begin(), row.end(), p.value.begin() + r * cols);
    }
    params.push_back(std::move(p));
    return static_cast<int>(params.size() - 1);
  };
#define WEFT_TAKE(dst, name, cols, rows) \
  do {                                   \
    auto i_ = add(name, cols, rows);     \
    if (!i_) return i_.error();          \
    dst = *i_;                           \
  } while (0)
  WEFT_TAKE(m->embd_, "token_embd.weight", d, hp->n_vocab);
  WEFT_TAKE(m->out_norm_, "output_norm.weight", d, 1);
  if (hp->tied_output) {
    m->output_ = m->embd_;
  } else {
    WEFT_TAKE(m->output_, "output.weight", d, hp->n_vocab);
  }
  for (int64_t il = 0; il < hp->n_layers; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    layer_params l{};
    WEFT_TAKE(l.attn_norm, p + "attn_norm.weight", d, 1);
    WEFT_TAKE(l.wq, p + "attn_q.weight", d, qd);
    WEFT_TAKE(l.wk, p + "attn_k.weight", d, kvd);
    WEFT_TAKE(l.wv, p + "attn_v.weight", d, kvd);
    WEFT_TAKE(l.wo, p + "attn_output.weight", qd, d);
    WEFT_TAKE(l.ffn_norm, p + "ffn_norm.weight", d, 1);
    if (hp->n_experts > 0) {
      const int64_t ne = hp->n_experts, eff = m->moe_ff_;
      WEFT_TAKE(l.router, p + "ffn_gate_inp.weight", d, ne);
      WEFT_TAKE(l.gate_exps, p + "ffn_gate_exps.weight", d, eff * ne);
      WEFT_TAKE(l.up_exps, p + "ffn_up_exps.weight", d, eff * ne);
      WEFT_TAKE(l.down_exps, p + "ffn_down_exps.weight", eff, d * ne);
    } else {
      WEFT_TAKE(l.gate, p + "ffn_gate.weight", d, hp->n_ff);
      WEFT_TAKE(l.up, p + "ffn_up.weight", d, hp->n_ff);
      WEFT_TAKE(l.down, p + "ffn_down.weight", hp->n_ff, d);
    }
    m->layers_.push_back(l);
  }
#undef WEFT_TAKE
  if (const gguf_tensor* rf = file.find_tensor("rope_freqs.weight"); rf != nullptr) {
    if (rf->type != ggml_type::f32 || rf->n_elements != hp->rope.n_dims / 2) {
      return status{status_code::bad_model, "rope_freqs.weight must be f32 [rope dims / 2]"};
    }
    const auto* f = reinterpret_cast<const float*>(rf->data);
    m->rope_freqs_.assign(f, f + rf->n_elements);
  }
  m->hp_.rope.freq_factors = nullptr;
  return m;
}

template <class T>
parameter<T>* trainable_model<T>::find(std::string_view name) {
  params_changed_ = true;
  settle_grads();
  for (auto& p : params_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

template <class T>
int64_t trainable_model<T>::n_parameters() const {
  int64_t total = 0;
  for (const auto& p : params_) total += p.size();
  return total;
}

template <class T>
std::vector<std::span<T>> trainable_model<T>::gradients() {
  settle_grads();
  std::vector<std::span<T>> out;
  for (auto& p : params_) out.emplace_back(p.grad);
  return out;
}

template <class T>
std::vector<std::span<T>> trainable_model<T>::gradient_buffers() {
  std::vector<std::span<T>> out;
  for (auto& p : params_) out.emplace_back(p.grad);
  return out;
}

template <class T>
std::vector<std::vector<int>> trainable_model<T>::gradient_groups() const {
  std::vector<std::vector<int>> groups;
  groups.push_back(hp_.tied_output ? std::vector<int>{out_norm_}
                                   : std::vector<int>{output_, out_norm_});
  for (auto l = layers_.rbegin(); l != layers_.rend(); ++l) {
    std::vector<int> g;
    for (const int i : {l->attn_norm, l->wq, l->wk, l->wv, l->wo, l->ffn_norm, l->gate, l->up,
                        l->down, l->router, l->gate_exps, l->up_exps, l->down_exps}) {
      if (i >= 0) g.push_back(i);
    }
    groups.push_back(std::move(g));
  }
  groups.push_back({embd_});
  return groups;
}

template <class T>
void trainable_model<T>::zero_grad(int threads) {
  if (device_resident()) {
    device_->zero_grads();
    return;
  }
  // Only marked: the backward's first write into each gradient overwrites it (grad_sink).
  grad_fresh_.assign(params_.size(), 1);
  zero_threads_ = std::max(1, threads);
}

template <class T>
typename trainable_model<T>::grad_sink trainable_model<T>::own_grads() {
  grad_fresh_.resize(params_.size(), 0);
  grad_sink s;
  for (auto& p : params_) {
    s.data.push_back(p.grad.data());
    s.size.push_back(static_cast<int64_t>(p.grad.size()));
  }
  s.fresh = &grad_fresh_;
  return s;
}

template <class T>
void trainable_model<T>::settle_grads() {
  if (std::find(grad_fresh_.begin(), grad_fresh_.end(), uint8_t{1}) == grad_fresh_.end()) return;
  own_grads().settle(zero_threads_);
}

template <class T>
status trainable_model<T>::check(const train_batch& b) const {
  const auto n = static_cast<int64_t>(b.tokens.size());
  if (n == 0) return {status_code::invalid_argument, "train batch is empty"};
  if (b.targets.size() != b.tokens.size() || b.seqs.n_tokens() != n || b.seqs.starts.front() != 0) {
    return {status_code::invalid_argument, "train batch: tokens, targets and sequences disagree"};
  }
  if (!b.seqs.prefix.empty()) {
    if (static_cast<int64_t>(b.seqs.prefix.size()) != b.seqs.n_seqs()) {
      return {status_code::invalid_argument, "train batch: one prefix entry per sequence needed"};
    }
    for (int64_t s = 0; s < b.seqs.n_seqs(); ++s) {
      const int64_t p = b.seqs.prefix[static_cast<size_t>(s)];
      if (p >= s || (p >= 0 && b.seqs.prefix[static_cast<size_t>(p)] >= 0) || p < -1) {
        return {status_code::invalid_argument,
                "train batch: sequence " + std::to_string(s) +
                    "'s prefix must be an earlier sequence without a prefix of its own"};
      }
    }
  }
  if (!b.policy.empty() && b.policy.size() != b.tokens.size()) {
    return {status_code::invalid_argument, "train batch: policy inputs and tokens disagree"};
  }
  if (!b.routes.empty()) {
    const int64_t k = hp_.n_experts_used;
    if (hp_.n_experts == 0 || b.route_width != hp_.n_layers * k ||
        static_cast<int64_t>(b.routes.size()) % b.route_width != 0 ||
        static_cast<int64_t>(b.routes.size()) > n * b.route_width) {
      return {status_code::invalid_argument,
              "train batch: routes need a mixture-of-experts model and layers x experts used (" +
                  std::to_string(hp_.n_layers * k) + ") entries per position"};
    }
    const route_shape shape{hp_.n_layers, hp_.n_experts, k};
    const int64_t bad = first_invalid_route(
        b.routes.data(), static_cast<int64_t>(b.routes.size()) / b.route_width, shape);
    if (bad >= 0) {
      return {status_code::invalid_argument, "train batch: position " + std::to_string(bad) +
                                                 " has an invalid expert list in its routes"};
    }
  }
  for (size_t s = 1; s < b.seqs.starts.size(); ++s) {
    if (b.seqs.starts[s] < b.seqs.starts[s - 1])
      return {status_code::invalid_argument, "train batch: sequence starts must not decrease"};
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = b.tokens[static_cast<size_t>(i)];
    const int32_t y = b.targets[static_cast<size_t>(i)];
    if (t < 0 || t >= hp_.n_vocab || y < -1 || y >= hp_.n_vocab) {
      return {status_code::invalid_argument,
              "train batch: token id out of range at position " + std::to_string(i)};
    }
  }
  return {};
}

template <class T>
void trainable_model<T>::layer_forward(int64_t il, const forward_state& fs, const T* x_in,
                                       layer_acts& a, T* x_out) {
  const layer_params& l = layers_[static_cast<size_t>(il)];
  const int64_t n = fs.n;
  const int64_t d = hp_.n_embd;
  const int64_t qd = hp_.n_heads * hp_.head_dim;
  const int64_t kvd = hp_.n_kv_heads * hp_.head_dim;
  const int64_t ff = hp_.n_ff;
  const T eps = static_cast<T>(hp_.rms_eps);
  auto w = [&](int i) { return params_[static_cast<size_t>(i)].value.data(); };
  sized(a.xn1, n * d);
  sized(a.rstd1, n);
  rms_norm_forward(x_in, w(l.attn_norm), n, d, eps, a.xn1.data(), a.rstd1.data());
  linear_forward(a.xn1.data(), w(l.wq), n, d, qd, sized(a.q, n * qd));
  linear_forward(a.xn1.data(), w(l.wk), n, d, kvd, sized(a.k, n * kvd));
  linear_forward(a.xn1.data(), w(l.wv), n, d, kvd, sized(a.v, n * kvd));
  rope_apply(a.q.data(), n, hp_.n_heads, hp_.head_dim, fs.rope, hp_.rope.style, false);
  rope_apply(a.k.data(), n, hp_.n_kv_heads, hp_.head_dim, fs.rope, hp_.rope.style, false);
  attention_forward(a.q.data(), a.k.data(), a.v.data(), fs.batch->seqs, fs.shape,
                    sized(a.att, n * qd), sized(a.lse, n * hp_.n_heads));
  T* x_mid = sized(a.x_mid, n * d);
  linear_forward(a.att.data(), w(l.wo), n, qd, d, x_mid);
  for (int64_t i = 0; i < n * d; ++i) x_mid[i] += x_in[i];
  sized(a.xn2, n * d);
  sized(a.rstd2, n);
  rms_norm_forward(x_mid, w(l.ffn_norm), n, d, eps, a.xn2.data(), a.rstd2.data());
  if (l.router >= 0) {
    moe_forward(l, il, fs, n, a, x_out);
    for (int64_t i = 0; i < n * d; ++i) x_out[i] += x_mid[i];
    return;
  }
  linear_forward(a.xn2.data(), w(l.gate), n, d, ff, sized(a.gate, n * ff));
  linear_forward(a.xn2.data(), w(l.up), n, d, ff, sized(a.up, n * ff));
  swiglu_forward(a.gate.data(), a.up.data(), n * ff, sized(a.h, n * ff));
  linear_forward(a.h.data(), w(l.down), n, ff, d, x_out);
  for (int64_t i = 0; i < n * d; ++i) x_out[i] += x_mid[i];
}

template <class T>
void trainable_model<T>::forward(const train_batch& b, forward_state& fs) {
  const int64_t n = b.n_tokens();
  const int64_t d = hp_.n_embd;
  fs.n = n;
  fs.batch = &b;
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t s = 0; s < b.seqs.n_seqs(); ++s) {
    for (int64_t i = b.seqs.starts[static_cast<size_t>(s)];
         i < b.seqs.starts[static_cast<size_t>(s) + 1]; ++i) {
      pos[static_cast<size_t>(i)] = static_cast<int32_t>(i - b.seqs.starts[static_cast<size_t>(s)] +
                                                         b.seqs.first_position(s));
    }
  }
  rope_config rc = hp_.rope;
  rc.freq_factors = rope_freqs_.empty() ? nullptr : rope_freqs_.data();
  fs.rope = make_rope_table(pos, rc);
  fs.shape = {hp_.n_heads, hp_.n_kv_heads, hp_.head_dim,
              1.0 / std::sqrt(static_cast<double>(hp_.head_dim))};
  fs.layers.resize(static_cast<size_t>(hp_.n_layers));
  const auto& embd = params_[static_cast<size_t>(embd_)].value;
  std::vector<T>& x = fs.x_final;
  x.resize(static_cast<size_t>(n * d));
  for (int64_t t = 0; t < n; ++t) {
    const auto* row = embd.data() + static_cast<int64_t>(b.tokens[static_cast<size_t>(t)]) * d;
    std::copy(row, row + d, x.begin() + t * d);
  }
  if (hp_.n_experts > 0) fs.balance.reset(hp_.n_experts);
  for (int64_t il = 0; il < hp_.n_layers; ++il) {
    layer_acts& a = fs.layers[static_cast<size_t>(il)];
    a.x_in.assign(x.begin(), x.end());
    layer_acts& acts = config_.recompute ? fs.scratch : a;
    layer_forward(il, fs, a.x_in.data(), acts, x.data());
    if (hp_.n_experts > 0) {
      fs.balance.add(acts.route);
      fs.routes_forced += acts.route.forced;
      fs.routes_differ += acts.route.differ;
    }
  }
  fs.xn_final.resize(static_cast<size_t>(n * d));
  fs.rstd_final.resize(static_cast<size_t>(n));
  rms_norm_forward(x.data(), params_[static_cast<size_t>(out_norm_)].value.data(), n, d,
                   static_cast<T>(hp_.rms_eps), fs.xn_final.data(), fs.rstd_final.data());
}

template <class T>
void trainable_model<T>::layer_backward(int64_t il, const forward_state& fs, backward_scratch& b,
                                        grad_sink& grads, layer_acts& a, T* dx) {
  const layer_params& l = layers_[static_cast<size_t>(il)];
  const int64_t n = fs.n;
  const int64_t d = hp_.n_embd;
  const int64_t qd = hp_.n_heads * hp_.head_dim;
  const int64_t kvd = hp_.n_kv_heads * hp_.head_dim;
  const int64_t ff = hp_.n_ff;
  auto w = [&](int i) { return params_[static_cast<size_t>(i)].value.data(); };
  // linear_backward of weight wi over the n rows; its gradient GEMM overwrites a gradient that
  // zero_grad marked (grad_sink), else adds.
  auto linear = [&](const T* x, int wi, const T* dy, int64_t in, int64_t out, T* dxp, bool add) {
    T beta = T(1);
    T* gw = grads.gemm_into(wi, beta);
    linear_backward(x, w(wi), dy, n, in, out, dxp, gw, add, beta);
  };
  // dx holds ∂L/∂x_out. Feed-forward half: x_out = x_mid + down(swiglu(gate(xn2), up(xn2))).
  T* dxn = sized(b.dxn, n * d);
  if (l.router >= 0) {
    moe_backward(l, n, b, grads, a, dx, dxn, fs.balance_grad);
  } else {
    T* dh = sized(b.dh, n * ff);
    T* dgate = sized(b.dgate, n * ff);
    T* dup = sized(b.dup, n * ff);
    linear(a.h.data(), l.down, dx, ff, d, dh, false);
    swiglu_backward(a.gate.data(), a.up.data(), dh, n * ff, dgate, dup);
    linear(a.xn2.data(), l.gate, dgate, d, ff, dxn, false);
    linear(a.xn2.data(), l.up, dup, d, ff, dxn, true);
  }
  rms_norm_backward(a.x_mid.data(), w(l.ffn_norm), a.rstd2.data(), dxn, n, d, dx,
                    grads.add_into(l.ffn_norm));
  // dx holds ∂L/∂x_mid. Attention half: x_mid = x_in + wo(attention(rope(q), rope(k), v)).
  T* datt = sized(b.datt, n * qd);
  T* dq = sized(b.dq, n * qd);
  T* dk = sized(b.dk, n * kvd);
  T* dv = sized(b.dv, n * kvd);
  linear(a.att.data(), l.wo, dx, qd, d, datt, false);
  attention_backward(a.q.data(), a.k.data(), a.v.data(), a.att.data(), a.lse.data(), datt,
                     fs.batch->seqs, fs.shape, dq, dk, dv);
  rope_apply(dq, n, hp_.n_heads, hp_.head_dim, fs.rope, hp_.rope.style, true);
  rope_apply(dk, n, hp_.n_kv_heads, hp_.head_dim, fs.rope, hp_.rope.style, true);
  linear(a.xn1.data(), l.wq, dq, d, qd, dxn, false);
  linear(a.xn1.data(), l.wk, dk, d, kvd, dxn, true);
  linear(a.xn1.data(), l.wv, dv, d, kvd, dxn, true);
  rms_norm_backward(a.x_in.data(), w(l.attn_norm), a.rstd1.data(), dxn, n, d, dx,
                    grads.add_into(l.attn_norm));
}

template <class T>
result<loss_sum> trainable_model<T>::forward_backward(const train_batch& b) {
  if (auto st = check(b); !st) return st;
  if (device_) return on_device({&b}, nullptr);
  grad_sink grads = own_grads();
  const loss_sum l = accumulate(b, *fs_, *bs_, grads, nullptr);
  grads.settle(zero_threads_);
  return l;
}

template <class T>
result<loss_sum> trainable_model<T>::forward_backward(const train_batch& b,
                                                      const token_objective<T>& objective) {
  if (auto st = check(b); !st) return st;
  if (device_) return on_device({&b}, &objective);
  grad_sink grads = own_grads();
  const loss_sum l = accumulate(b, *fs_, *bs_, grads, &objective);
  grads.settle(zero_threads_);
  return l;
}

template <class T>
result<loss_sum> trainable_model<T>::forward_backward(
    std::span<const std::vector<train_batch>> shares) {
  return run_shares(shares, nullptr);
}

template <class T>
result<loss_sum> trainable_model<T>::forward_backward(
    std::span<const std::vector<train_batch>> shares, const token_objective<T>& objective) {
  return run_shares(shares, &objective);
}

template <class T>
result<loss_sum> trainable_model<T>::forward_backward(
    std::span<const std::vector<train_batch>> shares, const gradient_ready& ready) {
  return run_shares(shares, nullptr, &ready);
}

template <class T>
result<loss_sum> trainable_model<T>::forward_backward(
    std::span<const std::vector<train_batch>> shares, const token_objective<T>& objective,
    const gradient_ready& ready) {
  return run_shares(shares, &objective, &ready);
}

template <class T>
result<loss_sum> trainable_model<T>::run_shares(std::span<const std::vector<train_batch>> shares,
                                                const token_objective<T>* objective,
                                                const gradient_ready* ready) {
  for (const auto& share : shares) {
    for (const auto& b : share) {
      if (auto st = check(b); !st) return st;
    }
  }
  const auto groups = ready != nullptr ? gradient_groups() : std::vector<std::vector<int>>{};
  if (device_) {
    // One device: the shares' batches in share order, summed into one set of gradients.
    std::vector<const train_batch*> all;
    for (const auto& share : shares)
      for (const auto& b : share) all.push_back(&b);
    auto r = on_device(all, objective);
    if (r && ready != nullptr) {
      for (size_t g = 0; g < groups.size(); ++g) (*ready)(g);
    }
    return r;
  }
  grad_sink own = own_grads();
  if (shares.empty()) {
    own.settle(zero_threads_);
    for (size_t g = 0; g < groups.size(); ++g) (*ready)(g);
    return loss_sum{};
  }
  const size_t extra = shares.size() - 1;
  std::vector<grad_sink> replica_grads(extra);
  // With `ready`: per group, the shares that finished it; the last adds the replicas' gradients
  // into the parameters' (share order, as the loop at the end does without `ready`) and tells.
  std::unique_ptr<std::atomic<int>[]> finished(new std::atomic<int>[groups.size()]());
  auto group_done = [&](size_t g) {
    if (finished[g].fetch_add(1, std::memory_order_acq_rel) + 1 != static_cast<int>(shares.size()))
      return;
    for (size_t j = 0; j < extra; ++j) {
      for (const int i : groups[g]) {
        T* dst = params_[static_cast<size_t>(i)].grad.data();
        const T* src = replica_grads[j].data[static_cast<size_t>(i)];
        for (int64_t k = 0; k < own.size[static_cast<size_t>(i)]; ++k) dst[k] += src[k];
      }
    }
    (*ready)(g);
  };
  const std::function<void(size_t)> on_group = group_done;
  auto run_share = [&](const std::vector<train_batch>& share, forward_state& fs,
                       backward_scratch& bs, grad_sink& grads) {
    loss_sum total;
    for (size_t k = 0; k < share.size(); ++k) {
      // The share's last batch finishes its gradients, group by group.
      const bool tell = ready != nullptr && k + 1 == share.size();
      const loss_sum l = accumulate(share[k], fs, bs, grads, objective, tell ? &on_group : nullptr);
      total.sum += l.sum;
      total.tokens += l.tokens;
    }
    grads.settle(1);  // on the share's own thread
    if (ready != nullptr && share.empty()) {
      for (size_t g = 0; g < groups.size(); ++g) group_done(g);
    }
    return total;
  };
  while (replicas_.size() < extra) replicas_.push_back(std::make_unique<replica>());
  for (size_t j = 0; j < extra; ++j) {
    auto& r = *replicas_[j];
    r.grads.resize(params_.size());
    r.fresh.assign(params_.size(), 1);  // zero, cleared by the share's first write (grad_sink)
    for (size_t i = 0; i < params_.size(); ++i) {
      r.grads[i].resize(params_[i].grad.size());
      replica_grads[j].data.push_back(r.grads[i].data());
      replica_grads[j].size.push_back(static_cast<int64_t>(r.grads[i].size()));
    }
    replica_grads[j].fresh = &r.fresh;
  }
  std::vector<loss_sum> losses(shares.size());
  std::vector<std::thread> threads;
  for (size_t j = 1; j < shares.size(); ++j) {
    threads.emplace_back([&, j] {
      auto& r = *replicas_[j - 1];
      losses[j] = run_share(shares[j], r.fs, r.bs, replica_grads[j - 1]);
    });
  }
  losses[0] = run_share(shares[0], *fs_, *bs_, own);
  for (auto& t : threads) t.join();
  loss_sum total = losses[0];
  for (size_t j = 1; j < shares.size(); ++j) {
    total.sum += losses[j].sum;
    total.tokens += losses[j].tokens;
    if (ready != nullptr) continue;  // group_done added them
    // All tensors as one range on the shares' threads (most are too small to split alone).
    parallel_tensor_ranges(own.size, static_cast<int>(shares.size()),
                           [&](size_t i, int64_t lo, int64_t hi) {
                             T* dst = params_[i].grad.data();
                             const T* src = replica_grads[j - 1].data[i];
                             for (int64_t k = lo; k < hi; ++k) dst[k] += src[k];
                           });
  }
  return total;
}

template <class T>
loss_sum trainable_model<T>::accumulate(const train_batch& b, forward_state& fs,
                                        backward_scratch& sc, grad_sink& grads,
                                        const token_objective<T>* objective,
                                        const std::function<void(size_t)>* on_group) {
  const auto groups = on_group != nullptr ? gradient_groups() : std::vector<std::vector<int>>{};
  auto finished = [&](size_t g) {
    if (on_group == nullptr) return;
    grads.settle(std::span<const int>(groups[g]));
    (*on_group)(g);
  };
  forward(b, fs);
  const int64_t n = fs.n;
  const int64_t d = hp_.n_embd;
  const int64_t vocab = hp_.n_vocab;
  auto& out_w = params_[static_cast<size_t>(output_)];
  // Output head and loss, a chunk of loss rows at a time; ∂L/∂xn_final is scattered back.
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < n; ++i) {
    if (b.targets[static_cast<size_t>(i)] >= 0) rows.push_back(i);
  }
  loss_sum loss;
  loss.tokens = static_cast<int64_t>(rows.size());
  fs.balance_grad.clear();
  if (hp_.n_experts > 0 && config_.router_aux_loss_coef > 0.0) {
    // The load-balancing loss, weighted like the micro-batch's loss (balance_weight).
    const double scale =
        config_.router_aux_loss_coef * balance_weight(b, rows, objective != nullptr);
    loss.sum += scale * fs.balance.loss();
    fs.balance_grad = fs.balance.prob_grad(scale);
  }
  std::vector<T>& dxn = sc.dxn_final;
  dxn.assign(static_cast<size_t>(n * d), T(0));
  const int64_t chunk = std::max<int64_t>(1, config_.head_chunk_rows);
  std::vector<T>&xc = sc.xc, &logits = sc.logits, &dlogits = sc.dlogits, &dxc = sc.dxc;
  std::vector<int32_t> targets;
  std::vector<T> logp, dlogp;
  for (size_t r0 = 0; r0 < rows.size(); r0 += static_cast<size_t>(chunk)) {
    const int64_t m = std::min<int64_t>(chunk, static_cast<int64_t>(rows.size() - r0));
    xc.resize(static_cast<size_t>(m * d));
    targets.resize(static_cast<size_t>(m));
    for (int64_t j = 0; j < m; ++j) {
      const int64_t row = rows[r0 + static_cast<size_t>(j)];
      std::copy_n(fs.xn_final.begin() + row * d, d, xc.begin() + j * d);
      targets[static_cast<size_t>(j)] = b.targets[static_cast<size_t>(row)];
    }
    logits.resize(static_cast<size_t>(m * vocab));
    dlogits.resize(logits.size());
    dxc.resize(xc.size());
    linear_forward(xc.data(), out_w.value.data(), m, d, vocab, logits.data());
    // A per-token objective at a sampling temperature: log p = log-softmax(logits / t).
    const T inv_t = objective != nullptr ? T(1) / logit_temperature_ : T(1);
    if (inv_t != T(1)) {
      for (T& v : logits) v *= inv_t;
    }
    if (objective == nullptr) {
      loss.sum += cross_entropy(logits.data(), targets.data(), m, vocab, T(1), dlogits.data(),
                                static_cast<T*>(nullptr));
    } else {
      // dlogits = softmax − onehot = −∂logp/∂logits, so ∂ℓ/∂logits = −(dℓ/dlogp) · dlogits.
      logp.resize(static_cast<size_t>(m));
      dlogp.assign(static_cast<size_t>(m), T(0));
      cross_entropy(logits.data(), targets.data(), m, vocab, T(1), dlogits.data(), logp.data());
      loss.sum += (*objective)(
          b, std::span<const int64_t>(rows).subspan(r0, static_cast<size_t>(m)), logp, dlogp);
      for (int64_t j = 0; j < m; ++j) {
        const T scale = -dlogp[static_cast<size_t>(j)] * inv_t;  // ∂(logits / t)/∂logits = 1/t
        T* row = dlogits.data() + j * vocab;
        for (int64_t v = 0; v < vocab; ++v) row[v] *= scale;
      }
    }
    T beta = T(1);
    T* out_g = grads.gemm_into(output_, beta);
    linear_backward(xc.data(), out_w.value.data(), dlogits.data(), m, d, vocab, dxc.data(), out_g,
                    false, beta);
    for (int64_t j = 0; j < m; ++j) {
      std::copy_n(dxc.begin() + j * d, d, dxn.begin() + rows[r0 + static_cast<size_t>(j)] * d);
    }
  }
  std::vector<T>& dx = sc.dx;
  dx.assign(static_cast<size_t>(n * d), T(0));
  auto& onorm = params_[static_cast<size_t>(out_norm_)];
  rms_norm_backward(fs.x_final.data(), onorm.value.data(), fs.rstd_final.data(), dxn.data(), n, d,
                    dx.data(), grads.add_into(out_norm_));
  finished(0);
  std::vector<T>& x_out = sc.x_out;
  x_out.resize(static_cast<size_t>(n * d));
  for (int64_t il = hp_.n_layers - 1; il >= 0; --il) {
    layer_acts& a = fs.layers[static_cast<size_t>(il)];
    if (config_.recompute) {
      // The layer again, into the one scratch set, from its saved input.
      layer_forward(il, fs, a.x_in.data(), fs.scratch, x_out.data());
      std::swap(fs.scratch.x_in, a.x_in);
      layer_backward(il, fs, sc, grads, fs.scratch, dx.data());
      std::swap(fs.scratch.x_in, a.x_in);
    } else {
      layer_backward(il, fs, sc, grads, a, dx.data());
    }
    finished(static_cast<size_t>(hp_.n_layers - il));
  }
  T* embd_grad = grads.add_into(embd_);
  for (int64_t t = 0; t < n; ++t) {
    T* row = embd_grad + static_cast<int64_t>(b.tokens[static_cast<size_t>(t)]) * d;
    for (int64_t i = 0; i < d; ++i) row[i] += dx[static_cast<size_t>(t * d + i)];
  }
  finished(static_cast<size_t>(hp_.n_layers + 1));
  return loss;
}

template <class T>
result<loss_sum> trainable_model<T>::on_device(std::vector<const train_batch*> batches,
                                               const token_objective<T>* objective) {
  if constexpr (!std::is_same_v<T, float>) {
    return status{status_code::unsupported, "a device runs the f32 trainer only"};
  } else {
    settle_grads();  // an offloaded backward adds into the host gradients
    const bool upload = params_changed_;
    auto r = device_->forward_backward(batches, objective, params_, upload);
    if (r) params_changed_ = false;
    return r;
  }
}

template <class T>
result<std::vector<T>> trainable_model<T>::logits(const train_batch& b) {
  if (auto st = check(b); !st) return st;
  if constexpr (std::is_same_v<T, float>) {
    if (device_) {
      auto r = device_->logits(b, params_, params_changed_);
      if (r) params_changed_ = false;
      return r;
    }
  }
  forward_state& fs = *fs_;
  forward(b, fs);
  std::vector<T> out(static_cast<size_t>(fs.n * hp_.n_vocab));
  linear_forward(fs.xn_final.data(), params_[static_cast<size_t>(output_)].value.data(), fs.n,
                 hp_.n_embd, hp_.n_vocab, out.data());
  return out;
}

template <class T>
std::pair<int64_t, int64_t> trainable_model<T>::take_routing_stats() {
  std::pair<int64_t, int64_t> out{0, 0};
  auto take = [&](forward_state& fs) {
    out.first += fs.routes_forced;
    out.second += fs.routes_differ;
    fs.routes_forced = fs.routes_differ = 0;
  };
  take(*fs_);
  for (auto& r : replicas_) take(r->fs);
  if constexpr (std::is_same_v<T, float>) {
    if (device_) {
      const auto d = device_->take_routing_stats();
      out.first += d.first;
      out.second += d.second;
    }
  }
  return out;
}

template <class T>
void trainable_model<T>::set_logit_temperature(T t) {
  logit_temperature_ = t;
  if (device_) device_->set_logit_temperature(static_cast<float>(t));
}

template <class T>
result<std::vector<T>> trainable_model<T>::target_logprobs(const train_batch& b) {
  auto all = logits(b);
  if (!all) return all.error();
  if (logit_temperature_ != T(1)) {
    const T inv_t = T(1) / logit_temperature_;
    for (T& v : *all) v *= inv_t;
  }
  std::vector<T> out;
  for (int64_t i = 0; i < b.n_tokens(); ++i) {
    const int32_t y = b.targets[static_cast<size_t>(i)];
    if (y < 0) continue;
    T lp{};
    cross_entropy(all->data() + i * hp_.n_vocab, &y, 1, hp_.n_vocab, T(0), static_cast<T*>(nullptr),
                  &lp);
    out.push_back(lp);
  }
  return out;
}

template class trainable_model<float>;
template class trainable_model<double>;

}  // namespace weft::gpu::train
