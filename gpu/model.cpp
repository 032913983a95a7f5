#include "gpu/model.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace weft::gpu {

namespace {

// Activation buffer indices.
enum buf_id : int {
  b_x,   // residual stream [n][embd]
  b_xn,  // normed input of a sub-layer [n][embd]
  b_q,   // [n][heads * head_dim]
  b_k,   // [n][kv_heads * head_dim]
  b_v,
  b_att,   // attention output [n][heads * head_dim]
  b_tmp,   // sub-layer output [n][embd]
  b_gate,  // [n][ff]
  b_up,
  b_h,
  b_xl,       // rows that produce logits [n][embd]
  b_logits,   // [rows that produce logits][vocab] (its own capacity: logit_rows_)
  b_router,   // [n][experts]
  b_exp_in,   // [n][embd]
  b_exp_out,  // [n][embd]
  b_slots,    // [n * k][embd]
  b_weights,  // [n * k]
  b_count
};

std::string arch_key(const std::string& arch, const char* suffix) {
  return arch + "." + suffix;
}

}  // namespace

void forward_batch::add(seq_id seq, std::span<const int32_t> toks, bool logits_last,
                        bool as_decode) {
  auto it = std::find(seqs.begin(), seqs.end(), seq);
  const auto index = static_cast<int32_t>(it - seqs.begin());
  if (it == seqs.end()) {
    seqs.push_back(seq);
    decode_numerics.push_back(as_decode ? 1 : 0);
  } else if (as_decode) {
    decode_numerics[static_cast<size_t>(index)] = 1;
  }
  for (size_t i = 0; i < toks.size(); ++i) {
    tokens.push_back(toks[i]);
    seq_index.push_back(index);
    want_logits.push_back(logits_last && i + 1 == toks.size() ? 1 : 0);
  }
}

void forward_batch::clear() {
  seqs.clear();
  tokens.clear();
  seq_index.clear();
  want_logits.clear();
  decode_numerics.clear();
  want_hidden.clear();
}

model::model(gguf_file file, device& dev, const model_load_config& config)
    : file_(std::move(file)), dev_(dev), ops_(dev.ops()), config_(config) {}

model::~model() {
  for (auto& b : uploaded_) dev_.release(b);
  for (auto& b : bufs_) dev_.release(b);
  dev_.release(ints_);
}

result<model_hparams> read_model_hparams(const gguf_file& f) {
  model_hparams hp;
  hp.architecture = std::string{f.architecture()};
  if (hp.architecture != "llama") {
    return status{status_code::unsupported,
                  "architecture '" + hp.architecture + "' is not supported (llama family only)"};
  }
  const std::string& a = hp.architecture;
  auto u = [&](const char* key) -> result<int64_t> {
    auto v = f.get_u64(arch_key(a, key));
    if (!v) return v.error();
    return static_cast<int64_t>(*v);
  };
  auto u_or = [&](const char* key, int64_t def) -> int64_t {
    auto v = f.get_u64(arch_key(a, key));
    return v ? static_cast<int64_t>(*v) : def;
  };
  auto f_or = [&](const char* key, float def) -> float {
    auto v = f.get_f32(arch_key(a, key));
    return v ? *v : def;
  };
  for (auto [dst, key] :
       {std::pair{&hp.n_embd, "embedding_length"}, std::pair{&hp.n_layers, "block_count"},
        std::pair{&hp.n_heads, "attention.head_count"},
        std::pair{&hp.n_ff, "feed_forward_length"}}) {
    auto v = u(key);
    if (!v) return status{status_code::bad_model, v.error().message()};
    *dst = *v;
  }
  hp.n_kv_heads = u_or("attention.head_count_kv", hp.n_heads);
  hp.n_ctx_train = u_or("context_length", 0);
  if (hp.n_heads <= 0 || hp.n_kv_heads <= 0 || hp.n_embd <= 0 || hp.n_layers <= 0 ||
      hp.n_heads % hp.n_kv_heads != 0) {
    return status{status_code::bad_model, "inconsistent head counts or sizes"};
  }
  hp.head_dim = u_or("attention.key_length", hp.n_embd / hp.n_heads);
  hp.rms_eps = f_or("attention.layer_norm_rms_epsilon", 1e-5f);
  hp.rope.style = rope_style::normal;
  hp.rope.n_dims = u_or("rope.dimension_count", hp.head_dim);
  hp.rope.freq_base = f_or("rope.freq_base", 10000.0f);
  if (auto t = f.get_string(arch_key(a, "rope.scaling.type")); t) {
    if (*t == "linear") {
      const float factor = f_or("rope.scaling.factor", 1.0f);
      if (factor > 0.0f) hp.rope.freq_scale = 1.0f / factor;
    } else if (*t != "none") {
      return status{status_code::unsupported,
                    "rope scaling '" + std::string{*t} + "' is not supported"};
    }
  } else if (const float factor = f_or("rope.scale_linear", 0.0f); factor > 0.0f) {
    hp.rope.freq_scale = 1.0f / factor;
  }
  hp.n_experts = u_or("expert_count", 0);
  hp.n_experts_used = u_or("expert_used_count", 0);
  if (hp.n_experts > 0 && (hp.n_experts_used <= 0 || hp.n_experts_used > hp.n_experts)) {
    return status{status_code::bad_model, "expert_used_count must be in [1, expert_count]"};
  }
  const gguf_tensor* embd = f.find_tensor("token_embd.weight");
  if (embd == nullptr) return status{status_code::bad_model, "tensor 'token_embd.weight' missing"};
  hp.n_vocab = embd->ne[1];
  hp.tied_output = f.find_tensor("output.weight") == nullptr;
  return hp;
}

result<std::unique_ptr<model>> model::load(gguf_file file, device& dev,
                                           const model_load_config& config) {
  std::unique_ptr<model> m{new model(std::move(file), dev, config)};
  auto hp = read_model_hparams(m->file_);
  if (!hp) return hp.error();
  m->hp_ = *hp;
  if (auto st = m->bind_weights(); !st) return st;
  spdlog::info("model: {} layers, embd {}, heads {}/{}, ff {}, vocab {}, experts {}/{}, {} on {}",
               hp->n_layers, hp->n_embd, hp->n_heads, hp->n_kv_heads, hp->n_ff, hp->n_vocab,
               hp->n_experts_used, hp->n_experts, type_name(m->layers_[0].wq.type),
               dev.capabilities().name);
  return m;
}

result<tensor_view> model::weight(const std::string& name, int64_t n_cols, int64_t n_rows,
                                  int64_t n_mats, bool required) {
  const gguf_tensor* t = file_.find_tensor(name);
  if (t == nullptr) {
    if (!required) return tensor_view{};
    return status{status_code::bad_model, "tensor '" + name + "' missing"};
  }
  if (t->ne[0] != n_cols || t->ne[1] != n_rows || t->ne[2] != n_mats || t->ne[3] != 1) {
    return status{status_code::bad_model,
                  "tensor '" + name + "' has shape [" + std::to_string(t->ne[0]) + ", " +
                      std::to_string(t->ne[1]) + ", " + std::to_string(t->ne[2]) + "], expected [" +
                      std::to_string(n_cols) + ", " + std::to_string(n_rows) + ", " +
                      std::to_string(n_mats) + "]"};
  }
  tensor_view v;
  v.type = t->type;
  v.data = t->data;
  v.n_cols = n_cols;
  v.n_rows = n_rows;
  v.n_mats = n_mats;
  v.row_bytes = t->row_size_bytes();
  v.mat_bytes = v.row_bytes * static_cast<size_t>(n_rows);
  if (dev_.capabilities().memory == memory_visibility::device_only) {
    auto b = dev_.allocate(t->size_bytes);
    if (!b) return b.error();
    uploaded_.push_back(*b);
    uploaded_names_.emplace_back(name, b->data);
    if (auto st = dev_.copy_to_device(b->data, t->data, t->size_bytes); !st) return st;
    v.data = b->data;
  }
  return v;
}

status model::set_weight(std::string_view name, std::span<const float> values) {
  const gguf_tensor* t = file_.find_tensor(name);
  if (t == nullptr)
    return {status_code::not_found, "set_weight: no tensor '" + std::string(name) + "'"};
  if (static_cast<int64_t>(values.size()) != t->n_elements) {
    return {status_code::invalid_argument, "set_weight: tensor '" + std::string(name) + "' has " +
                                               std::to_string(t->n_elements) + " values, got " +
                                               std::to_string(values.size())};
  }
  void* device_copy = nullptr;
  for (const auto& [n, p] : uploaded_names_) {
    if (n == name) device_copy = p;
  }
  std::byte* dst = nullptr;
  if (device_copy != nullptr) {
    staging_.resize(t->size_bytes);
    dst = staging_.data();
  } else {
    dst = file_.mutable_tensor_data(*t);
    if (dst == nullptr) {
      return {status_code::unsupported,
              "set_weight: the model's weights are a read-only file mapping; load the model from "
              "an in-memory image (gguf_file::parse) to update them"};
    }
  }
  const int64_t cols = t->ne[0];
  const size_t row_bytes = t->row_size_bytes();
  for (int64_t r = 0; r < t->n_rows(); ++r) {
    const row_status rs = quantize_row(t->type, values.data() + r * cols,
                                       dst + static_cast<size_t>(r) * row_bytes, cols);
    if (rs != row_status::ok) {
      return {status_code::unsupported, "set_weight: cannot convert to the type of tensor '" +
                                            std::string(name) + "' (" +
                                            std::string(type_name(t->type)) + ")"};
    }
  }
  if (device_copy != nullptr) {
    if (auto st = dev_.copy_to_device(device_copy, staging_.data(), staging_.size()); !st)
      return st;
    return dev_.synchronize();
  }
  for (const auto& [n, w] : packed_) {
    if (n != name) continue;
    if (auto st = ops_.pack_weight(w, const_cast<void*>(w.packed)); !st) return st;
  }
  return {};
}

status model::pack(tensor_view& w, const std::string& name) {
  if (ops_.packed_weight_bytes(w) > 0) to_pack_.emplace_back(&w, name);
  return {};
}

// Every packed copy in one allocation: a decode step streams all of them, and one large buffer is
// one the device can back with huge pages (the CPU device does from 4 MiB), as the model file's
// weights are (docs/engine.md, "Weights in huge pages").
status model::pack_all() {
  const auto padded = [](size_t n) { return (n + 63) / 64 * 64; };
  std::vector<size_t> bytes;
  bytes.reserve(to_pack_.size());
  size_t total = 0;
  for (const auto& [w, name] : to_pack_) {
    bytes.push_back(padded(ops_.packed_weight_bytes(*w)));
    total += bytes.back();
  }
  if (total == 0) return {};
  auto b = dev_.allocate(total);
  if (!b) return b.error();
  uploaded_.push_back(*b);
  auto* at = static_cast<std::byte*>(b->data);
  for (size_t i = 0; i < to_pack_.size(); ++i) {
    const auto& [w, name] = to_pack_[i];
    if (auto st = ops_.pack_weight(*w, at); !st) return st;
    w->packed = at;
    packed_.emplace_back(name, *w);
    at += bytes[i];
  }
  to_pack_.clear();
  return {};
}

status model::bind_weights() {
  const auto& hp = hp_;
  const int64_t qd = hp.n_heads * hp.head_dim;
  const int64_t kvd = hp.n_kv_heads * hp.head_dim;
  auto take = [&](tensor_view& dst, const std::string& name, int64_t c, int64_t r,
                  int64_t m = 1) -> status {
    auto w = weight(name, c, r, m);
    if (!w) return w.error();
    dst = *w;
    return {};
  };
  auto matrix = [&](tensor_view& dst, const std::string& name, int64_t c, int64_t r,
                    int64_t m = 1) -> status {
    if (auto st = take(dst, name, c, r, m); !st) return st;
    const auto& types = dev_.capabilities().weight_types;
    if (std::find(types.begin(), types.end(), dst.type) == types.end()) {
      return {status_code::unsupported, "tensor '" + name + "' has type " +
                                            std::string{type_name(dst.type)} + ", which " +
                                            dev_.capabilities().name + " cannot multiply"};
    }
    return pack(dst, name);
  };
  if (auto st = take(tok_embd_, "token_embd.weight", hp.n_embd, hp.n_vocab); !st) return st;
  if (auto st = take(output_norm_, "output_norm.weight", hp.n_embd, 1); !st) return st;
  if (output_norm_.type != ggml_type::f32)
    return {status_code::bad_model, "output_norm.weight must be f32"};
  if (file_.find_tensor("output.weight") != nullptr) {
    if (auto st = matrix(output_, "output.weight", hp.n_embd, hp.n_vocab); !st) return st;
  } else {
    output_ = tok_embd_;
    if (auto st = pack(output_, "token_embd.weight"); !st) return st;
  }
  if (file_.find_tensor("rope_freqs.weight") != nullptr) {
    tensor_view rf;
    if (auto st = take(rf, "rope_freqs.weight", hp.rope.n_dims / 2, 1); !st) return st;
    if (rf.type != ggml_type::f32) return {status_code::bad_model, "rope_freqs.weight must be f32"};
    hp_.rope.freq_factors = static_cast<const float*>(rf.data);
  }
  layers_.resize(static_cast<size_t>(hp.n_layers));
  for (int64_t i = 0; i < hp.n_layers; ++i) {
    layer_weights& l = layers_[static_cast<size_t>(i)];
    const std::string p = "blk." + std::to_string(i) + ".";
    if (auto st = take(l.attn_norm, p + "attn_norm.weight", hp.n_embd, 1); !st) return st;
    if (auto st = take(l.ffn_norm, p + "ffn_norm.weight", hp.n_embd, 1); !st) return st;
    if (l.attn_norm.type != ggml_type::f32 || l.ffn_norm.type != ggml_type::f32) {
      return {status_code::bad_model, p + "*_norm.weight must be f32"};
    }
    if (auto st = matrix(l.wq, p + "attn_q.weight", hp.n_embd, qd); !st) return st;
    if (auto st = matrix(l.wk, p + "attn_k.weight", hp.n_embd, kvd); !st) return st;
    if (auto st = matrix(l.wv, p + "attn_v.weight", hp.n_embd, kvd); !st) return st;
    if (auto st = matrix(l.wo, p + "attn_output.weight", qd, hp.n_embd); !st) return st;
    if (hp.n_experts > 0) {
      const gguf_tensor* ge = file_.find_tensor(p + "ffn_gate_exps.weight");
      if (ge == nullptr)
        return {status_code::bad_model, "tensor '" + p + "ffn_gate_exps.weight' missing"};
      const int64_t ff = ge->ne[1];
      if (auto st = matrix(l.ffn_gate_inp, p + "ffn_gate_inp.weight", hp.n_embd, hp.n_experts); !st)
        return st;
      if (auto st =
              matrix(l.ffn_gate_exps, p + "ffn_gate_exps.weight", hp.n_embd, ff, hp.n_experts);
          !st)
        return st;
      if (auto st = matrix(l.ffn_up_exps, p + "ffn_up_exps.weight", hp.n_embd, ff, hp.n_experts);
          !st)
        return st;
      if (auto st =
              matrix(l.ffn_down_exps, p + "ffn_down_exps.weight", ff, hp.n_embd, hp.n_experts);
          !st)
        return st;
    } else {
      if (auto st = matrix(l.ffn_gate, p + "ffn_gate.weight", hp.n_embd, hp.n_ff); !st) return st;
      if (auto st = matrix(l.ffn_up, p + "ffn_up.weight", hp.n_embd, hp.n_ff); !st) return st;
      if (auto st = matrix(l.ffn_down, p + "ffn_down.weight", hp.n_ff, hp.n_embd); !st) return st;
    }
  }
  return pack_all();
}

kv_layout model::kv_layout_for(int64_t block_size) const {
  kv_layout l;
  l.n_layers = hp_.n_layers;
  l.n_kv_heads = hp_.n_kv_heads;
  l.head_dim = hp_.head_dim;
  l.block_size = block_size;
  l.dtype = ggml_type::f16;
  return l;
}

size_t model::weight_bytes_per_token() const {
  size_t total = output_.mat_bytes + tok_embd_.row_bytes;
  for (const auto& l : layers_) {
    total += l.wq.mat_bytes + l.wk.mat_bytes + l.wv.mat_bytes + l.wo.mat_bytes;
    if (hp_.n_experts > 0) {
      // Only the routed experts are read per token.
      const size_t per_expert =
          l.ffn_gate_exps.mat_bytes + l.ffn_up_exps.mat_bytes + l.ffn_down_exps.mat_bytes;
      total += l.ffn_gate_inp.mat_bytes + per_expert * static_cast<size_t>(hp_.n_experts_used);
    } else {
      total += l.ffn_gate.mat_bytes + l.ffn_up.mat_bytes + l.ffn_down.mat_bytes;
    }
  }
  return total;
}

int64_t model::matmul_macs_per_token() const {
  auto macs = [](const tensor_view& t) { return t.n_rows * t.n_cols; };
  int64_t total = macs(output_);
  for (const auto& l : layers_) {
    total += macs(l.wq) + macs(l.wk) + macs(l.wv) + macs(l.wo);
    if (hp_.n_experts > 0) {
      total += macs(l.ffn_gate_inp) +
               (macs(l.ffn_gate_exps) + macs(l.ffn_up_exps) + macs(l.ffn_down_exps)) *
                   hp_.n_experts_used;
    } else {
      total += macs(l.ffn_gate) + macs(l.ffn_up) + macs(l.ffn_down);
    }
  }
  return total;
}

status model::reserve(int64_t n_tokens, int64_t n_logit_rows) {
  return ensure_buffers(n_tokens, n_logit_rows);
}

status model::ensure_buffers(int64_t n, int64_t n_logits) {
  n_logits = std::max<int64_t>(n_logits, 1);
  if (n <= buf_tokens_ && n_logits <= logit_rows_) return {};
  if (bufs_.size() != b_count) bufs_.assign(b_count, device_buffer{});
  // The logits ([rows][vocab], 100 MB for 512 rows of a 49k vocabulary) are sized by the rows
  // that want them — a prompt chunk has one — not by the pass's tokens: the device zeroes what it
  // allocates, and a VM backs first-touched memory slowly.
  if (n_logits > logit_rows_) {
    dev_.release(bufs_[b_logits]);
    bufs_[b_logits] = {};
    auto b = dev_.allocate(static_cast<size_t>(n_logits * hp_.n_vocab) * sizeof(float));
    if (!b) return b.error();
    bufs_[b_logits] = *b;
    logit_rows_ = n_logits;
  }
  if (n <= buf_tokens_) return {};
  for (int i = 0; i < b_count; ++i) {
    if (i == b_logits) continue;
    dev_.release(bufs_[static_cast<size_t>(i)]);
    bufs_[static_cast<size_t>(i)] = {};
  }
  const int64_t qd = hp_.n_heads * hp_.head_dim;
  const int64_t kvd = hp_.n_kv_heads * hp_.head_dim;
  int64_t ff = hp_.n_ff;
  if (hp_.n_experts > 0) ff = std::max(ff, layers_[0].ffn_gate_exps.n_rows);
  const int64_t k = std::max<int64_t>(1, hp_.n_experts_used);
  const int64_t widths[b_count] = {hp_.n_embd,
                                   hp_.n_embd,
                                   qd,
                                   kvd,
                                   kvd,
                                   qd,
                                   hp_.n_embd,
                                   ff,
                                   ff,
                                   ff,
                                   hp_.n_embd,
                                   hp_.n_vocab,
                                   std::max<int64_t>(1, hp_.n_experts),
                                   hp_.n_embd,
                                   hp_.n_embd,
                                   hp_.n_embd * k,
                                   k};
  for (int i = 0; i < b_count; ++i) {
    if (i == b_logits) continue;
    auto b = dev_.allocate(static_cast<size_t>(n * widths[i]) * sizeof(float));
    if (!b) return b.error();
    bufs_[static_cast<size_t>(i)] = *b;
  }
  buf_tokens_ = n;
  return {};
}

status model::ffn_dense(const layer_weights& lw, int64_t n) {
  const tensor_view gate_up[] = {lw.ffn_gate, lw.ffn_up};
  float* const outs[] = {buf(b_gate), buf(b_up)};
  if (auto st = ops_.matmul_multi(gate_up, buf(b_xn), n, outs); !st) return st;
  if (auto st = ops_.swiglu(buf(b_gate), buf(b_up), buf(b_h), n * lw.ffn_gate.n_rows); !st)
    return st;
  return ops_.matmul(lw.ffn_down, buf(b_h), n, buf(b_tmp));
}

status model::ffn_moe(const layer_weights& lw, int64_t n, int64_t layer, forward_output& out) {
  const int64_t ne = hp_.n_experts;
  const int64_t k = hp_.n_experts_used;
  const int64_t d = hp_.n_embd;
  if (auto st = ops_.matmul(lw.ffn_gate_inp, buf(b_xn), n, buf(b_router)); !st) return st;
  // Routing is tiny ([n][experts]); it runs on the host as in llama.cpp's softmax -> top-k ->
  // renorm.
  std::vector<float> probs(static_cast<size_t>(n * ne));
  if (auto st = dev_.copy_to_host(probs.data(), buf(b_router), probs.size() * sizeof(float)); !st)
    return st;
  if (auto st = dev_.synchronize(); !st) return st;
  std::vector<float> weights(static_cast<size_t>(n * k));
  std::vector<std::vector<int32_t>> tokens_of(static_cast<size_t>(ne));
  std::vector<std::vector<int32_t>> slots_of(static_cast<size_t>(ne));
  std::vector<int32_t> chosen(static_cast<size_t>(n * k));
  std::vector<int32_t> order(static_cast<size_t>(ne));
  for (int64_t t = 0; t < n; ++t) {
    float* p = probs.data() + t * ne;
    float max = *std::max_element(p, p + ne);
    double sum = 0.0;
    for (int64_t e = 0; e < ne; ++e) sum += (p[e] = std::exp(p[e] - max));
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t e = 0; e < ne; ++e) p[e] *= inv;
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return p[x] > p[y]; });
    float wsum = 0.0f;
    for (int64_t j = 0; j < k; ++j) wsum += p[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = order[static_cast<size_t>(j)];
      weights[static_cast<size_t>(t * k + j)] = p[e] / wsum;
      chosen[static_cast<size_t>(t * k + j)] = e;
      tokens_of[static_cast<size_t>(e)].push_back(static_cast<int32_t>(t));
      slots_of[static_cast<size_t>(e)].push_back(static_cast<int32_t>(t * k + j));
    }
  }
  if (config_.record_expert_ids) out.expert_ids[static_cast<size_t>(layer)] = chosen;
  if (auto st = dev_.copy_to_device(buf(b_weights), weights.data(), weights.size() * sizeof(float));
      !st)
    return st;
  for (int64_t e = 0; e < ne; ++e) {
    const auto& toks = tokens_of[static_cast<size_t>(e)];
    if (toks.empty()) continue;
    const auto m = static_cast<int64_t>(toks.size());
    // Index lists go through the int buffer tail (after the batch's own ints).
    int32_t* ids = moe_ids_;
    if (auto st = dev_.copy_to_device(ids, toks.data(), toks.size() * sizeof(int32_t)); !st)
      return st;
    auto* sids = ids + n * k;
    const auto& sl = slots_of[static_cast<size_t>(e)];
    if (auto st = dev_.copy_to_device(sids, sl.data(), sl.size() * sizeof(int32_t)); !st) return st;
    if (auto st = ops_.gather_rows(buf(b_xn), ids, m, d, buf(b_exp_in)); !st) return st;
    if (auto st = ops_.matmul(lw.ffn_gate_exps.matrix(e), buf(b_exp_in), m, buf(b_gate)); !st)
      return st;
    if (auto st = ops_.matmul(lw.ffn_up_exps.matrix(e), buf(b_exp_in), m, buf(b_up)); !st)
      return st;
    if (auto st = ops_.swiglu(buf(b_gate), buf(b_up), buf(b_h), m * lw.ffn_gate_exps.n_rows); !st)
      return st;
    if (auto st = ops_.matmul(lw.ffn_down_exps.matrix(e), buf(b_h), m, buf(b_exp_out)); !st)
      return st;
    if (auto st = ops_.scatter_rows(buf(b_exp_out), sids, m, d, buf(b_slots)); !st) return st;
  }
  return ops_.weighted_sum(buf(b_slots), buf(b_weights), n, k, d, buf(b_tmp));
}

status model::forward(const forward_batch& batch, kv_cache& kv, forward_output& out) {
  const auto n = static_cast<int64_t>(batch.tokens.size());
  if (n == 0) return {status_code::invalid_argument, "forward: empty batch"};
  if (batch.seq_index.size() != batch.tokens.size() ||
      batch.want_logits.size() != batch.tokens.size() ||
      (!batch.want_hidden.empty() && batch.want_hidden.size() != batch.tokens.size())) {
    return {status_code::invalid_argument, "forward: batch arrays differ in length"};
  }
  if (!(kv.layout() == kv_layout_for(kv.layout().block_size))) {
    return {status_code::invalid_argument,
            "forward: KV cache layout " + kv.layout().describe() + " does not fit the model"};
  }
  const auto n_seqs = static_cast<int64_t>(batch.seqs.size());
  std::vector<int64_t> count(static_cast<size_t>(n_seqs), 0);
  for (int64_t t = 0; t < n; ++t) {
    const int32_t si = batch.seq_index[static_cast<size_t>(t)];
    if (si < 0 || si >= n_seqs)
      return {status_code::invalid_argument, "forward: bad sequence index"};
    const int32_t tok = batch.tokens[static_cast<size_t>(t)];
    if (tok < 0 || tok >= hp_.n_vocab)
      return {status_code::invalid_argument, "forward: token id out of range"};
    ++count[static_cast<size_t>(si)];
  }
  for (int64_t s = 0; s < n_seqs; ++s) {
    if (!kv.contains(batch.seqs[s]) || kv.is_swapped(batch.seqs[s])) {
      return {status_code::invalid_argument, "forward: sequence not resident in the KV cache"};
    }
    if (auto st = kv.reserve(batch.seqs[s], count[static_cast<size_t>(s)]); !st) return st;
  }
  // Host-side int arrays, then one upload.
  std::vector<int32_t> pos(static_cast<size_t>(n)), slots, table,
      offsets(static_cast<size_t>(n_seqs)), logit_rows, hidden_rows;
  std::vector<int64_t> next(static_cast<size_t>(n_seqs));
  for (int64_t s = 0; s < n_seqs; ++s) {
    next[static_cast<size_t>(s)] = kv.length(batch.seqs[s]);
    offsets[static_cast<size_t>(s)] = static_cast<int32_t>(table.size());
    const auto bt = kv.block_table(batch.seqs[s]);
    table.insert(table.end(), bt.begin(), bt.end());
  }
  int64_t max_pos = 0;
  for (int64_t t = 0; t < n; ++t) {
    const auto s = static_cast<size_t>(batch.seq_index[static_cast<size_t>(t)]);
    pos[static_cast<size_t>(t)] = static_cast<int32_t>(next[s]);
    max_pos = std::max(max_pos, next[s]);
    if (auto st = kv.slots(batch.seqs[s], next[s], 1, slots); !st) return st;
    ++next[s];
    if (!batch.want_hidden.empty() && batch.want_hidden[static_cast<size_t>(t)]) {
      hidden_rows.push_back(static_cast<int32_t>(t));
    } else if (batch.want_logits[static_cast<size_t>(t)]) {
      logit_rows.push_back(static_cast<int32_t>(t));
    }
  }
  // One index list on the device: the logit rows, then the hidden rows.
  const auto n_logit_rows = static_cast<int64_t>(logit_rows.size());
  const auto n_hidden = static_cast<int64_t>(hidden_rows.size());
  std::vector<int32_t> out_rows = logit_rows;
  out_rows.insert(out_rows.end(), hidden_rows.begin(), hidden_rows.end());
  if (auto st = ensure_buffers(std::max(n, std::min<int64_t>(config_.max_batch_tokens, 64)),
                               n_logit_rows);
      !st)
    return st;
  const int64_t k = std::max<int64_t>(1, hp_.n_experts_used);
  const size_t n_ints =
      static_cast<size_t>(5 * n + 2 * n_seqs) + table.size() + 2 * static_cast<size_t>(n * k);
  if (n_ints * sizeof(int32_t) > ints_capacity_) {
    dev_.release(ints_);
    ints_ = {};
    ints_capacity_ = 0;
    auto b = dev_.allocate(n_ints * sizeof(int32_t) * 2);
    if (!b) return b.error();
    ints_ = *b;
    ints_capacity_ = b->size_bytes;
  }
  auto* ib = static_cast<int32_t*>(ints_.data);
  int32_t* d_tokens = ib;
  int32_t* d_pos = d_tokens + n;
  int32_t* d_seq = d_pos + n;
  int32_t* d_slots = d_seq + n;
  int32_t* d_offsets = d_slots + n;
  int32_t* d_table = d_offsets + n_seqs;
  int32_t* d_logit_rows = d_table + table.size();
  int32_t* d_seq_n = d_logit_rows + n;
  auto up = [&](int32_t* dst, const std::vector<int32_t>& src) {
    return src.empty() ? status{}
                       : dev_.copy_to_device(dst, src.data(), src.size() * sizeof(int32_t));
  };
  if (auto st = up(d_tokens, batch.tokens); !st) return st;
  if (auto st = up(d_pos, pos); !st) return st;
  if (auto st = up(d_seq, batch.seq_index); !st) return st;
  if (auto st = up(d_slots, slots); !st) return st;
  if (auto st = up(d_offsets, offsets); !st) return st;
  if (auto st = up(d_table, table); !st) return st;
  if (auto st = up(d_logit_rows, out_rows); !st) return st;
  // The MoE index lists use 2 * n * k ints after the batch's own (see ffn_moe).
  std::vector<int32_t> seq_n(count.begin(), count.end());
  // The attention kernel picks GEMM (>= 2) or GEMV (1) numerics from this count.
  for (size_t s = 0; s < seq_n.size() && s < batch.decode_numerics.size(); ++s) {
    if (batch.decode_numerics[s] != 0) seq_n[s] = 1;
  }
  if (auto st = up(d_seq_n, seq_n); !st) return st;
  moe_ids_ = d_seq_n + n_seqs;

  burst_scope burst{dev_};
  const int64_t kvd = hp_.n_kv_heads * hp_.head_dim;
  if (config_.record_expert_ids) out.expert_ids.assign(static_cast<size_t>(hp_.n_layers), {});
  if (auto st = ops_.get_rows(tok_embd_, d_tokens, n, buf(b_x)); !st) return st;
  for (int64_t il = 0; il < hp_.n_layers; ++il) {
    const layer_weights& lw = layers_[static_cast<size_t>(il)];
    if (auto st = ops_.rms_norm(buf(b_x), static_cast<const float*>(lw.attn_norm.data), buf(b_xn),
                                n, hp_.n_embd, hp_.rms_eps);
        !st)
      return st;
    {
      const tensor_view qkv[] = {lw.wq, lw.wk, lw.wv};
      float* const outs[] = {buf(b_q), buf(b_k), buf(b_v)};
      if (auto st = ops_.matmul_multi(qkv, buf(b_xn), n, outs); !st) return st;
    }
    if (auto st = ops_.rope(buf(b_q), d_pos, n, hp_.n_heads, hp_.head_dim, hp_.rope); !st)
      return st;
    if (auto st = ops_.rope(buf(b_k), d_pos, n, hp_.n_kv_heads, hp_.head_dim, hp_.rope); !st)
      return st;
    kv_store_batch store;
    store.k = buf(b_k);
    store.v = buf(b_v);
    store.k_cache = kv.k_layer(il);
    store.v_cache = kv.v_layer(il);
    store.slots = d_slots;
    store.n_tokens = n;
    store.row_elems = kvd;
    if (auto st = ops_.kv_store(store); !st) return st;
    attention_batch att;
    att.q = buf(b_q);
    att.out = buf(b_att);
    att.k_cache = kv.k_layer(il);
    att.v_cache = kv.v_layer(il);
    att.token_seq = d_seq;
    att.token_pos = d_pos;
    att.block_table = d_table;
    att.seq_block_offset = d_offsets;
    att.seq_n_tokens = d_seq_n;
    att.n_tokens = n;
    att.n_heads = hp_.n_heads;
    att.n_kv_heads = hp_.n_kv_heads;
    att.head_dim = hp_.head_dim;
    att.block_size = kv.layout().block_size;
    att.scale = 1.0f / std::sqrt(static_cast<float>(hp_.head_dim));
    att.max_positions = max_pos + 1;
    if (auto st = ops_.attention(att); !st) return st;
    if (auto st = ops_.matmul(lw.wo, buf(b_att), n, buf(b_tmp)); !st) return st;
    if (auto st = ops_.add(buf(b_tmp), buf(b_x), buf(b_x), n * hp_.n_embd); !st) return st;
    if (auto st = ops_.rms_norm(buf(b_x), static_cast<const float*>(lw.ffn_norm.data), buf(b_xn), n,
                                hp_.n_embd, hp_.rms_eps);
        !st)
      return st;
    if (hp_.n_experts > 0) {
      if (auto st = ffn_moe(lw, n, il, out); !st) return st;
    } else {
      if (auto st = ffn_dense(lw, n); !st) return st;
    }
    if (auto st = ops_.add(buf(b_tmp), buf(b_x), buf(b_x), n * hp_.n_embd); !st) return st;
  }
  const int64_t n_out = n_logit_rows;
  out.n_vocab = hp_.n_vocab;
  out.token_index = logit_rows;
  out.logits.resize(static_cast<size_t>(n_out * hp_.n_vocab));
  out.hidden_index = hidden_rows;
  out.hidden.resize(static_cast<size_t>(n_hidden * hp_.n_embd));
  if (n_hidden > 0) {
    // The output head's input: the final norm of the residual stream.
    if (auto st = ops_.gather_rows(buf(b_x), d_logit_rows + n_logit_rows, n_hidden, hp_.n_embd,
                                   buf(b_xl));
        !st)
      return st;
    if (auto st = ops_.rms_norm(buf(b_xl), static_cast<const float*>(output_norm_.data), buf(b_xn),
                                n_hidden, hp_.n_embd, hp_.rms_eps);
        !st)
      return st;
    if (auto st =
            dev_.copy_to_host(out.hidden.data(), buf(b_xn), out.hidden.size() * sizeof(float));
        !st)
      return st;
  }
  if (n_out > 0) {
    if (auto st = ops_.gather_rows(buf(b_x), d_logit_rows, n_out, hp_.n_embd, buf(b_xl)); !st)
      return st;
    if (auto st = ops_.rms_norm(buf(b_xl), static_cast<const float*>(output_norm_.data), buf(b_xn),
                                n_out, hp_.n_embd, hp_.rms_eps);
        !st)
      return st;
    if (auto st = ops_.matmul(output_, buf(b_xn), n_out, buf(b_logits)); !st) return st;
    if (auto st =
            dev_.copy_to_host(out.logits.data(), buf(b_logits), out.logits.size() * sizeof(float));
        !st) {
      return st;
    }
  }
  if (auto st = dev_.synchronize(); !st) return st;
  for (int64_t s = 0; s < n_seqs; ++s) {
    std::vector<int32_t> toks;
    for (int64_t t = 0; t < n; ++t) {
      if (batch.seq_index[static_cast<size_t>(t)] == s)
        toks.push_back(batch.tokens[static_cast<size_t>(t)]);
    }
    if (auto st = kv.commit(batch.seqs[s], toks); !st) return st;
  }
  return {};
}

}  // namespace weft::gpu
