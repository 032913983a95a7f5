#include "gpu/tiny_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <unordered_map>

#include "gpu/gguf_writer.hpp"
#include "gpu/internal/tokenizer_pretokenize.hpp"
#include "gpu/internal/tokenizer_unicode.hpp"

namespace weft::gpu {

namespace {

// Text the tiny vocabulary's merges are learned from (written for weft).
constexpr std::string_view training_text =
    "The system runs many small workers. Each worker holds a part of the model and a cache of keys "
    "and values. When a request arrives, the router looks at the prompt, finds the worker that has "
    "seen the longest prefix, and sends the request there. The worker reads the prompt, computes "
    "the "
    "next token, and streams it back to the user. If a worker dies, the supervisor starts a new "
    "one "
    "and the request is sent again. The user does not notice anything, except that the answer is a "
    "little late. Tokens are the words of the model: a token can be a whole word, a part of a "
    "word, "
    "or a single byte. The tokenizer splits the text into words, then merges the most frequent "
    "pairs "
    "of symbols into larger tokens. Numbers such as 2024, 42 or 3.14 are split into digits. "
    "Hello! How are you today? I'm fine, thank you. We're testing the model with this text, and "
    "they'll check that it works. What is the capital of France? The capital of France is Paris. "
    "Write a short poem about the sea: the sea is wide, the sea is deep, the waves are singing me "
    "to "
    "sleep. def main():\n    print(\"hello world\")\n    return 0\n"
    "for (int i = 0; i < n; ++i) { sum += values[i]; }\n"
    "The quick brown fox jumps over the lazy dog. The five boxing wizards jump quickly. "
    "Once upon a time there was a little robot who wanted to learn how to paint. Every day the "
    "robot went to the garden and looked at the flowers, the trees and the sky. ";

constexpr std::string_view chatml_template =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

constexpr const char* special_texts[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

// splitmix64: a tiny, portable PRNG with good statistical quality.
class prng {
 public:
  explicit prng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform in [-1, 1).
  float symmetric() {
    return static_cast<float>(static_cast<double>(next() >> 11) * 0x1.0p-52 - 1.0);
  }

 private:
  uint64_t state_;
};

std::string byte_level(std::string_view utf8) {
  std::string out;
  for (char c : utf8) internal::append_utf8(out, internal::byte_to_cpt(static_cast<uint8_t>(c)));
  return out;
}

// Learns up to `n_merges` BPE merges from training_text split by the SmolLM pre-tokenizer.
// Ties between equally frequent pairs are broken by the smaller pair (deterministic).
std::vector<std::pair<std::string, std::string>> learn_merges(size_t n_merges) {
  const auto cpts = internal::decode_utf8_lenient(training_text);
  const auto words = internal::split_gpt2(cpts, internal::split_each_number(cpts, {cpts.size()}));
  std::map<std::vector<std::string>, int> word_counts;
  size_t begin = 0;
  for (size_t len : words) {
    std::string utf8;
    for (size_t i = begin; i < begin + len; ++i) internal::append_utf8(utf8, cpts[i]);
    std::vector<std::string> symbols;
    for (char c : utf8) symbols.push_back(byte_level(std::string_view(&c, 1)));
    ++word_counts[symbols];
    begin += len;
  }
  std::vector<std::pair<std::vector<std::string>, int>> corpus(word_counts.begin(),
                                                               word_counts.end());
  std::vector<std::pair<std::string, std::string>> merges;
  while (merges.size() < n_merges) {
    std::map<std::pair<std::string, std::string>, int> pair_counts;
    for (const auto& [symbols, count] : corpus) {
      for (size_t i = 1; i < symbols.size(); ++i)
        pair_counts[{symbols[i - 1], symbols[i]}] += count;
    }
    const std::pair<std::string, std::string>* best = nullptr;
    int best_count = 1;  // a pair must occur at least twice to be worth a merge
    for (const auto& [pair, count] : pair_counts) {
      if (count > best_count) {
        best = &pair;
        best_count = count;
      }
    }
    if (best == nullptr) break;
    const auto merge = *best;
    merges.push_back(merge);
    for (auto& [symbols, count] : corpus) {
      std::vector<std::string> merged;
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == merge.first && symbols[i + 1] == merge.second) {
          merged.push_back(merge.first + merge.second);
          ++i;
        } else {
          merged.push_back(symbols[i]);
        }
      }
      symbols = std::move(merged);
    }
  }
  return merges;
}

status invalid(const std::string& what) {
  return status{status_code::invalid_argument, "tiny_model: " + what};
}

}  // namespace

std::string_view tiny_chat_template() {
  return chatml_template;
}

result<tokenizer::vocabulary> tiny_vocabulary(uint32_t n_vocab) {
  constexpr uint32_t n_fixed = 3 + 256;
  if (n_vocab < n_fixed) return invalid("n_vocab must be at least " + std::to_string(n_fixed));
  tokenizer::vocabulary v;
  for (const char* s : special_texts) {
    v.tokens.emplace_back(s);
    v.types.push_back(token_type::control);
  }
  for (uint32_t b = 0; b < 256; ++b) {
    std::string t;
    internal::append_utf8(t, internal::byte_to_cpt(static_cast<uint8_t>(b)));
    v.tokens.push_back(t);
    v.types.push_back(token_type::normal);
  }
  std::unordered_map<std::string, bool> present;
  for (const auto& t : v.tokens) present[t] = true;
  for (const auto& [left, right] : learn_merges(n_vocab - n_fixed)) {
    if (v.tokens.size() >= n_vocab) break;
    v.merges.push_back(left + " " + right);
    const std::string merged = left + right;
    if (!present[merged]) {
      present[merged] = true;
      v.tokens.push_back(merged);
      v.types.push_back(token_type::normal);
    }
  }
  for (uint32_t i = 0; v.tokens.size() < n_vocab; ++i) {
    v.tokens.push_back("<|unused_" + std::to_string(i) + "|>");
    v.types.push_back(token_type::unused);
  }
  v.pre = pre_tokenizer::smollm;
  v.bos = 1;
  v.eos = 2;
  v.unk = 0;
  v.pad = 2;
  v.add_bos = false;
  return v;
}

result<std::vector<std::byte>> make_tiny_model(const tiny_model_config& c) {
  if (c.n_layers == 0 || c.n_embd == 0 || c.n_head == 0 || c.n_head_kv == 0 || c.n_ff == 0) {
    return invalid("all sizes must be positive");
  }
  if (c.n_embd % c.n_head != 0) return invalid("n_embd must be a multiple of n_head");
  if (c.n_head % c.n_head_kv != 0) return invalid("n_head must be a multiple of n_head_kv");
  const uint32_t head_dim = c.n_embd / c.n_head;
  if (head_dim % 2 != 0) return invalid("the head dimension must be even (RoPE)");
  if ((c.n_expert == 0) != (c.n_expert_used == 0) || c.n_expert_used > c.n_expert) {
    return invalid("n_expert_used must be in 1..n_expert for MoE, both 0 for dense");
  }
  const ggml_type wt = c.weight_type;
  const ggml_type et = c.embedding_type.value_or(wt);
  for (ggml_type t : {wt, et}) {
    if (!type_traits(t).weft_supported || t == ggml_type::q8_1) {
      return invalid("unsupported weight type " + std::string(type_name(t)));
    }
  }
  const int64_t bs = std::max(type_traits(wt).block_size, type_traits(et).block_size);
  if (c.n_embd % bs != 0 || c.n_ff % bs != 0) {
    return invalid("n_embd and n_ff must be multiples of " + std::to_string(bs) +
                   " for the weight types");
  }
  auto vocab = tiny_vocabulary(c.n_vocab);
  if (!vocab.ok()) return vocab.error();

  gguf_writer w;
  w.set("general.architecture", "llama");
  w.set("general.name", c.name);
  w.set("general.file_type", llama_file_type(wt));
  w.set("llama.block_count", c.n_layers);
  w.set("llama.context_length", c.context_length);
  w.set("llama.embedding_length", c.n_embd);
  w.set("llama.feed_forward_length", c.n_ff);
  w.set("llama.attention.head_count", c.n_head);
  w.set("llama.attention.head_count_kv", c.n_head_kv);
  w.set("llama.rope.freq_base", c.rope_freq_base);
  w.set("llama.attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  w.set("llama.rope.dimension_count", head_dim);
  w.set("llama.vocab_size", c.n_vocab);
  if (c.n_expert > 0) {
    w.set("llama.expert_count", c.n_expert);
    w.set("llama.expert_used_count", c.n_expert_used);
  }
  auto& v = vocab.value();
  std::vector<int32_t> types;
  for (token_type t : v.types) types.push_back(static_cast<int32_t>(t));
  w.set("tokenizer.ggml.model", "gpt2");
  w.set("tokenizer.ggml.pre", "smollm");
  w.set("tokenizer.ggml.tokens", make_array(v.tokens));
  w.set("tokenizer.ggml.token_type", make_array(std::move(types)));
  w.set("tokenizer.ggml.merges", make_array(v.merges));
  w.set("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(*v.bos));
  w.set("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(*v.eos));
  w.set("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(*v.unk));
  w.set("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(*v.pad));
  w.set("tokenizer.ggml.add_bos_token", false);
  w.set("tokenizer.chat_template", std::string(chatml_template));

  prng rng(c.seed);
  // Matrices: uniform with variance ~1/fan_in (fan_in = row length ne[0]); norms around 1.
  const auto add = [&](const std::string& name, ggml_type type, std::vector<int64_t> ne,
                       float scale, float offset) -> status {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    std::vector<float> values(static_cast<size_t>(n));
    for (float& x : values) x = offset + scale * rng.symmetric();
    return w.add_tensor_from_f32(name, type, ne, values);
  };
  const auto matrix_scale = [](uint32_t fan_in) {
    return std::sqrt(3.0f / static_cast<float>(fan_in));
  };
  const int64_t e = c.n_embd, ff = c.n_ff, kv = static_cast<int64_t>(c.n_head_kv) * head_dim;
  status s = add("token_embd.weight", et, {e, c.n_vocab}, 1.0f, 0.0f);
  for (uint32_t l = 0; s.ok() && l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    if (s.ok()) s = add(p + "attn_norm.weight", ggml_type::f32, {e}, 0.1f, 1.0f);
    if (s.ok()) s = add(p + "attn_q.weight", wt, {e, e}, matrix_scale(c.n_embd), 0.0f);
    if (s.ok()) s = add(p + "attn_k.weight", wt, {e, kv}, matrix_scale(c.n_embd), 0.0f);
    if (s.ok()) s = add(p + "attn_v.weight", wt, {e, kv}, matrix_scale(c.n_embd), 0.0f);
    if (s.ok()) s = add(p + "attn_output.weight", wt, {e, e}, matrix_scale(c.n_embd), 0.0f);
    if (s.ok()) s = add(p + "ffn_norm.weight", ggml_type::f32, {e}, 0.1f, 1.0f);
    if (c.n_expert == 0) {
      if (s.ok()) s = add(p + "ffn_gate.weight", wt, {e, ff}, matrix_scale(c.n_embd), 0.0f);
      if (s.ok()) s = add(p + "ffn_up.weight", wt, {e, ff}, matrix_scale(c.n_embd), 0.0f);
      if (s.ok()) s = add(p + "ffn_down.weight", wt, {ff, e}, matrix_scale(c.n_ff), 0.0f);
    } else {
      const int64_t ne = c.n_expert;
      if (s.ok())
        s = add(p + "ffn_gate_inp.weight", ggml_type::f32, {e, ne}, matrix_scale(c.n_embd), 0.0f);
      if (s.ok())
        s = add(p + "ffn_gate_exps.weight", wt, {e, ff, ne}, matrix_scale(c.n_embd), 0.0f);
      if (s.ok()) s = add(p + "ffn_up_exps.weight", wt, {e, ff, ne}, matrix_scale(c.n_embd), 0.0f);
      if (s.ok()) s = add(p + "ffn_down_exps.weight", wt, {ff, e, ne}, matrix_scale(c.n_ff), 0.0f);
    }
  }
  if (s.ok()) s = add("output_norm.weight", ggml_type::f32, {e}, 0.1f, 1.0f);
  if (s.ok() && c.output == output_weight::separate) {
    s = add("output.weight", wt, {e, c.n_vocab}, matrix_scale(c.n_embd), 0.0f);
  }
  if (!s.ok()) return s;
  return w.to_bytes();
}

status write_tiny_model(const tiny_model_config& config, const std::filesystem::path& path) {
  auto bytes = make_tiny_model(config);
  if (!bytes.ok()) return bytes.error();
  const std::filesystem::path tmp = path.string() + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return invalid("cannot create '" + tmp.string() + "'");
  const size_t written = std::fwrite(bytes->data(), 1, bytes->size(), f);
  const bool closed = std::fclose(f) == 0;
  if (written != bytes->size() || !closed)
    return status{status_code::internal, "tiny_model: write failed"};
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec)
    return status{status_code::internal, "tiny_model: cannot rename to '" + path.string() + "'"};
  return {};
}

}  // namespace weft::gpu
