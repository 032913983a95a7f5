#include "gpu/tokenizer.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>

#include "gpu/gguf.hpp"
#include "gpu/internal/tokenizer_bpe.hpp"
#include "gpu/internal/tokenizer_pretokenize.hpp"
#include "gpu/internal/tokenizer_unicode.hpp"

namespace weft::gpu {

namespace {

// Texts of control tokens that end a turn in common chat formats (as llama.cpp detects them).
constexpr std::string_view end_of_generation_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",   "<|endoftext|>",
    "<|eom_id|>", "<EOT>",      "_<EOT>",  "<|end_of_text|>", "<｜end▁of▁sentence｜>",
};

status bad(const std::string& message) {
  return status{status_code::bad_model, "tokenizer: " + message};
}

}  // namespace

std::optional<pre_tokenizer> parse_pre_tokenizer(std::string_view name) {
  // Names as llama.cpp writes them into tokenizer.ggml.pre (each checked by the oracle test).
  for (std::string_view n :
       {"gpt-2", "gpt2", "phi-2", "jina-es", "jina-de", "jina-v1-en", "jina-v2-es", "jina-v2-de"}) {
    if (name == n) return pre_tokenizer::gpt2;
  }
  if (name == "smollm") return pre_tokenizer::smollm;
  for (std::string_view n : {"llama-bpe", "llama3", "llama-v3", "falcon3", "smaug-bpe"}) {
    if (name == n) return pre_tokenizer::llama3;
  }
  for (std::string_view n : {"qwen2", "deepseek-r1-qwen", "stablelm2"}) {
    if (name == n) return pre_tokenizer::qwen2;
  }
  return std::nullopt;
}

std::string_view pre_tokenizer_name(pre_tokenizer p) {
  switch (p) {
    case pre_tokenizer::gpt2:
      return "gpt-2";
    case pre_tokenizer::smollm:
      return "smollm";
    case pre_tokenizer::llama3:
      return "llama-bpe";
    case pre_tokenizer::qwen2:
      return "qwen2";
  }
  return "unknown";
}

struct tokenizer::impl {
  vocabulary v;
  internal::bpe_model bpe;
  std::vector<token_id> special_tokens;  // matched before BPE, longest text first
  std::vector<token_id> eog_ids;
  bool ignore_merges = false;  // llama3: a word that is a token is taken whole

  token_type type(token_id id) const {
    return v.types.empty() ? token_type::normal : v.types[static_cast<size_t>(id)];
  }

  std::optional<token_id> lookup(std::string_view text) const { return bpe.find(text); }

  internal::fragments pre_split(std::span<const uint32_t> cpts) const {
    internal::fragments f{cpts.size()};
    switch (v.pre) {
      case pre_tokenizer::gpt2:
        return internal::split_gpt2(cpts, f);
      case pre_tokenizer::smollm:
        return internal::split_gpt2(cpts, internal::split_each_number(cpts, f));
      case pre_tokenizer::llama3:
        return internal::split_llama3(cpts, f, 3);
      case pre_tokenizer::qwen2:
        return internal::split_llama3(cpts, f, 1);
    }
    return f;
  }

  void encode_raw(std::string_view text, std::vector<token_id>& out) const {
    if (text.empty()) return;
    const auto cpts = internal::decode_utf8_lenient(text);
    const auto words = pre_split(cpts);
    std::string word;
    std::string utf8;
    internal::bpe_scratch scratch;
    size_t begin = 0;
    for (size_t len : words) {
      word.clear();
      for (size_t i = begin; i < begin + len; ++i) {
        utf8.clear();
        internal::append_utf8(utf8, cpts[i]);
        for (char c : utf8)
          internal::append_utf8(word, internal::byte_to_cpt(static_cast<uint8_t>(c)));
      }
      bpe.encode_word(word, ignore_merges, scratch, out);
      begin += len;
    }
  }
};

tokenizer::tokenizer(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
tokenizer::tokenizer(tokenizer&&) noexcept = default;
tokenizer& tokenizer::operator=(tokenizer&&) noexcept = default;
tokenizer::~tokenizer() = default;

result<tokenizer> tokenizer::from_vocabulary(vocabulary v) {
  const size_t n = v.tokens.size();
  if (n == 0) return bad("the vocabulary is empty");
  if (n > static_cast<size_t>(std::numeric_limits<token_id>::max()))
    return bad("the vocabulary is too large");
  if (!v.types.empty() && v.types.size() != n) {
    return bad("token_type has " + std::to_string(v.types.size()) + " entries for " +
               std::to_string(n) + " tokens");
  }
  for (size_t i = 0; i < v.types.size(); ++i) {
    const auto t = static_cast<int32_t>(v.types[i]);
    if (t < 0 || t > 6)
      return bad("token " + std::to_string(i) + " has invalid type " + std::to_string(t));
  }
  const auto check_id = [&](const std::optional<token_id>& id, const char* what) -> status {
    if (id && (*id < 0 || static_cast<size_t>(*id) >= n)) {
      return bad(std::string(what) + " token id " + std::to_string(*id) +
                 " is outside the vocabulary of " + std::to_string(n));
    }
    return {};
  };
  for (auto [id, what] : {std::pair{&v.bos, "bos"},
                          {&v.eos, "eos"},
                          {&v.eot, "eot"},
                          {&v.unk, "unknown"},
                          {&v.pad, "padding"}}) {
    if (auto s = check_id(*id, what); !s) return s;
  }
  auto p = std::make_unique<impl>();
  if (auto bad_merge = p->bpe.build(v.tokens, v.merges)) {
    return bad("merge #" + std::to_string(*bad_merge) + " '" + v.merges[*bad_merge] +
               "' is not 'left right'");
  }
  p->v = std::move(v);
  for (size_t i = 0; i < n; ++i) {
    const token_type t = p->type(static_cast<token_id>(i));
    if ((t == token_type::control || t == token_type::user_defined || t == token_type::unknown) &&
        !p->v.tokens[i].empty()) {
      p->special_tokens.push_back(static_cast<token_id>(i));
    }
  }
  std::stable_sort(p->special_tokens.begin(), p->special_tokens.end(), [&](token_id a, token_id b) {
    return p->v.tokens[static_cast<size_t>(a)].size() > p->v.tokens[static_cast<size_t>(b)].size();
  });
  if (p->v.eos) p->eog_ids.push_back(*p->v.eos);
  if (p->v.eot) p->eog_ids.push_back(*p->v.eot);
  for (std::string_view text : end_of_generation_texts) {
    if (auto id = p->lookup(text); id && p->type(*id) == token_type::control)
      p->eog_ids.push_back(*id);
  }
  std::sort(p->eog_ids.begin(), p->eog_ids.end());
  p->eog_ids.erase(std::unique(p->eog_ids.begin(), p->eog_ids.end()), p->eog_ids.end());
  p->ignore_merges = p->v.pre == pre_tokenizer::llama3;
  return tokenizer(std::move(p));
}

result<tokenizer> tokenizer::from_gguf(const gguf_file& file, const tokenizer_options& options) {
  auto model = file.get_string("tokenizer.ggml.model");
  if (!model) return model.error();
  if (*model != "gpt2") {
    return status{status_code::unsupported,
                  "tokenizer: tokenizer.ggml.model '" + std::string(*model) +
                      "' is not supported (weft implements byte-level BPE, 'gpt2')"};
  }
  vocabulary v;
  auto tokens = file.get_string_array("tokenizer.ggml.tokens");
  if (!tokens) return tokens.error();
  v.tokens.assign(tokens->begin(), tokens->end());
  if (file.contains("tokenizer.ggml.token_type")) {
    auto types = file.get_array<int32_t>("tokenizer.ggml.token_type");
    if (!types) return types.error();
    v.types.reserve(types->size());
    for (int32_t t : *types) v.types.push_back(static_cast<token_type>(t));
  }
  auto merges = file.get_string_array("tokenizer.ggml.merges");
  if (!merges) return merges.error();
  v.merges.assign(merges->begin(), merges->end());

  if (options.pre_override) {
    v.pre = *options.pre_override;
  } else if (!file.contains("tokenizer.ggml.pre")) {
    // llama.cpp would use its "default" splitting here, which weft does not implement.
    spdlog::warn("tokenizer: tokenizer.ggml.pre is missing; using the GPT-2 pre-tokenizer");
    v.pre = pre_tokenizer::gpt2;
  } else {
    auto pre = file.get_string("tokenizer.ggml.pre");
    if (!pre) return pre.error();
    auto parsed = parse_pre_tokenizer(*pre);
    if (!parsed) {
      return status{
          status_code::unsupported,
          "tokenizer: tokenizer.ggml.pre '" + std::string(*pre) +
              "' is not supported (supported: gpt-2, smollm, llama-bpe, qwen2 and their aliases); "
              "set a pre-tokenizer override"};
    }
    v.pre = *parsed;
  }
  const auto optional_id = [&](const char* key, std::optional<token_id>& out) -> status {
    if (!file.contains(key)) return {};
    auto id = file.get_i32(key);
    if (!id) return id.error();
    out = *id;
    return {};
  };
  for (auto [key, out] : {std::pair{"tokenizer.ggml.bos_token_id", &v.bos},
                          {"tokenizer.ggml.eos_token_id", &v.eos},
                          {"tokenizer.ggml.eot_token_id", &v.eot},
                          {"tokenizer.ggml.unknown_token_id", &v.unk},
                          {"tokenizer.ggml.padding_token_id", &v.pad}}) {
    if (auto s = optional_id(key, *out); !s) return s;
  }
  // Llama 3 files add BOS unless they say otherwise; other BPE files only when they ask for it.
  v.add_bos = v.pre == pre_tokenizer::llama3;
  if (file.contains("tokenizer.ggml.add_bos_token")) {
    auto b = file.get_bool("tokenizer.ggml.add_bos_token");
    if (!b) return b.error();
    v.add_bos = *b;
  }
  if (file.contains("tokenizer.ggml.add_eos_token")) {
    auto b = file.get_bool("tokenizer.ggml.add_eos_token");
    if (!b) return b.error();
    v.add_eos = *b;
  }
  if (v.add_bos && !v.bos)
    return bad("tokenizer.ggml.add_bos_token is set but there is no bos_token_id");
  if (v.add_eos && !v.eos)
    return bad("tokenizer.ggml.add_eos_token is set but there is no eos_token_id");
  return from_vocabulary(std::move(v));
}

std::vector<token_id> tokenizer::encode(std::string_view text, add_special add,
                                        parse_special parse) const {
  const impl& p = *impl_;
  // Split the text into raw pieces and special tokens: each special token (longest first) is
  // searched in the raw pieces left so far.
  struct piece {
    size_t begin;
    size_t len;
    token_id id;  // -1: raw text
  };
  std::vector<piece> pieces{{0, text.size(), -1}};
  for (token_id st : p.special_tokens) {
    const token_type t = p.type(st);
    if (parse == parse_special::no && (t == token_type::control || t == token_type::unknown))
      continue;
    const std::string& needle = p.v.tokens[static_cast<size_t>(st)];
    std::vector<piece> next;
    next.reserve(pieces.size());
    for (const piece& pc : pieces) {
      if (pc.id >= 0) {
        next.push_back(pc);
        continue;
      }
      const std::string_view raw = text.substr(pc.begin, pc.len);
      size_t from = 0;
      for (size_t at = raw.find(needle); at != std::string_view::npos;
           at = raw.find(needle, from)) {
        if (at > from) next.push_back({pc.begin + from, at - from, -1});
        next.push_back({pc.begin + at, needle.size(), st});
        from = at + needle.size();
      }
      if (from < raw.size()) next.push_back({pc.begin + from, raw.size() - from, -1});
    }
    pieces = std::move(next);
  }
  std::vector<token_id> out;
  out.reserve(text.size() / 3 + 2);
  if (add == add_special::yes && p.v.add_bos) out.push_back(*p.v.bos);
  for (const piece& pc : pieces) {
    if (pc.id >= 0) {
      out.push_back(pc.id);
    } else {
      p.encode_raw(text.substr(pc.begin, pc.len), out);
    }
  }
  if (add == add_special::yes && p.v.add_eos) out.push_back(*p.v.eos);
  return out;
}

std::string tokenizer::token_to_piece(token_id id, render_special render) const {
  const impl& p = *impl_;
  if (id < 0 || static_cast<size_t>(id) >= p.v.tokens.size()) return {};
  const std::string& text = p.v.tokens[static_cast<size_t>(id)];
  switch (p.type(id)) {
    case token_type::control:
    case token_type::unknown:
      return render == render_special::yes ? text : std::string{};
    case token_type::user_defined:
      return text;
    case token_type::byte:
      // "<0xAB>" byte tokens (SentencePiece convention).
      if (text.size() == 6 && text.starts_with("<0x") && text.back() == '>') {
        return std::string(1, static_cast<char>(std::stoi(text.substr(3, 2), nullptr, 16)));
      }
      return text;
    default: {
      std::string out;
      out.reserve(text.size());
      for (uint32_t cpt : internal::decode_utf8_lenient(text)) {
        if (auto b = internal::cpt_to_byte(cpt)) {
          out.push_back(static_cast<char>(*b));
        } else {
          internal::append_utf8(out, cpt);  // not a byte-level character: keep it as written
        }
      }
      return out;
    }
  }
}

std::string tokenizer::decode(std::span<const token_id> ids, render_special render) const {
  std::string out;
  for (token_id id : ids) out += token_to_piece(id, render);
  return out;
}

size_t tokenizer::n_vocab() const {
  return impl_->v.tokens.size();
}
pre_tokenizer tokenizer::pre() const {
  return impl_->v.pre;
}

std::string_view tokenizer::token_text(token_id id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->v.tokens.size()) return {};
  return impl_->v.tokens[static_cast<size_t>(id)];
}

token_type tokenizer::type_of(token_id id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->v.tokens.size()) return token_type::undefined;
  return impl_->type(id);
}

std::optional<token_id> tokenizer::find_token(std::string_view text) const {
  return impl_->lookup(text);
}
bool tokenizer::adds_bos() const {
  return impl_->v.add_bos && impl_->v.bos.has_value();
}

std::optional<token_id> tokenizer::bos() const {
  return impl_->v.bos;
}
std::optional<token_id> tokenizer::eos() const {
  return impl_->v.eos;
}

bool tokenizer::is_end_of_generation(token_id id) const {
  return std::binary_search(impl_->eog_ids.begin(), impl_->eog_ids.end(), id);
}

std::span<const token_id> tokenizer::end_of_generation_ids() const {
  return impl_->eog_ids;
}

// -- streaming ----------------------------------------------------------------------------------

namespace {

// Copies `s` replacing every byte that does not start a well-formed sequence with U+FFFD.
void append_sanitized(std::string& out, std::string_view s) {
  for (uint32_t cpt : internal::decode_utf8_lenient(s)) internal::append_utf8(out, cpt);
}

}  // namespace

std::string detokenizer_stream::push(token_id id) {
  pending_ += tok_->token_to_piece(id, render_);
  const size_t hold = internal::incomplete_utf8_tail(pending_);
  std::string out;
  append_sanitized(out, std::string_view(pending_).substr(0, pending_.size() - hold));
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string detokenizer_stream::finish() {
  // An incomplete character at the end is one U+FFFD (not one per byte).
  const size_t hold = internal::incomplete_utf8_tail(pending_);
  std::string out;
  append_sanitized(out, std::string_view(pending_).substr(0, pending_.size() - hold));
  if (hold > 0) internal::append_utf8(out, internal::replacement_cpt);
  pending_.clear();
  return out;
}

}  // namespace weft::gpu
