#pragma once
/// Byte-level BPE tokenizer built from GGUF metadata (tokenizer.ggml.model = "gpt2"): the model
/// family's pre-tokenizer, ranked merges, special tokens matched before BPE, decoding, and a
/// streaming detokenizer that never emits half a UTF-8 character.
///
/// Token ids match llama.cpp's for the supported pre-tokenizers (checked by the oracle test
/// tests/oracle/gpu_tokenizer). A tokenizer is immutable after construction: const calls are
/// thread-safe.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpu/status.hpp"

namespace weft::gpu {

class gguf_file;

/// Index of a token in the vocabulary.
using token_id = int32_t;

/// Token kinds as stored in tokenizer.ggml.token_type.
enum class token_type : int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,       ///< Special tokens such as <|im_start|>: never produced by BPE.
  user_defined = 4,  ///< Added tokens matched verbatim in the text.
  unused = 5,
  byte = 6,
};

/// Word-splitting rules of a model family (tokenizer.ggml.pre).
enum class pre_tokenizer {
  gpt2,    ///< "gpt-2" (and files without tokenizer.ggml.pre).
  smollm,  ///< "smollm": every digit alone, then GPT-2 rules.
  llama3,  ///< "llama-bpe" / "llama3": Llama 3 rules (numbers in groups of up to 3).
  qwen2,   ///< "qwen2": Llama 3 rules with single digits.
};

/// Canonical name as written in tokenizer.ggml.pre ("gpt-2", "smollm", "llama-bpe", "qwen2").
std::string_view pre_tokenizer_name(pre_tokenizer p);
/// Parses a tokenizer.ggml.pre value, including llama.cpp's aliases ("phi-2" -> gpt2,
/// "llama3"/"falcon3"/"smaug-bpe" -> llama3, "deepseek-r1-qwen"/"stablelm2" -> qwen2, ...).
std::optional<pre_tokenizer> parse_pre_tokenizer(std::string_view name);

/// Whether encode() adds the model's BOS/EOS (as its metadata asks) or never.
enum class add_special { yes, no };
/// Whether the text of control tokens in the input is matched as those tokens (user-defined
/// tokens are always matched, as in llama.cpp).
enum class parse_special { no, yes };
/// Whether decoding renders control tokens as their text or drops them.
enum class render_special { no, yes };

/// Options of tokenizer::from_gguf.
struct tokenizer_options {
  /// Overrides tokenizer.ggml.pre (e.g. for files that lack it).
  std::optional<pre_tokenizer> pre_override;
};

/// A byte-level BPE vocabulary with its merges.
class tokenizer {
 public:
  /// Builds the tokenizer from a GGUF file's metadata; fails (bad_model / unsupported) with a
  /// message naming the key when the metadata is missing, inconsistent or of another family.
  static result<tokenizer> from_gguf(const gguf_file& file, const tokenizer_options& options = {});

  /// Raw parts of a vocabulary (what from_gguf reads from the metadata).
  struct vocabulary {
    std::vector<std::string> tokens;  ///< Byte-level encoded token texts.
    std::vector<token_type> types;    ///< Same size as tokens (empty: all normal).
    std::vector<std::string> merges;  ///< "left right", highest priority first.
    pre_tokenizer pre = pre_tokenizer::gpt2;
    std::optional<token_id> bos, eos, eot, unk, pad;
    bool add_bos = false;
    bool add_eos = false;
  };
  /// Builds the tokenizer from explicit parts (validated like from_gguf).
  static result<tokenizer> from_vocabulary(vocabulary v);

  tokenizer(tokenizer&&) noexcept;
  tokenizer& operator=(tokenizer&&) noexcept;
  ~tokenizer();

  /// Token ids of `text`.
  std::vector<token_id> encode(std::string_view text, add_special add = add_special::yes,
                               parse_special parse = parse_special::no) const;

  /// Bytes of one token (may be part of a UTF-8 character); control tokens give their text only
  /// with render_special::yes. Out-of-range ids give an empty string.
  std::string token_to_piece(token_id id, render_special render = render_special::no) const;

  /// Concatenated pieces of `ids` (invalid UTF-8 is kept as is).
  std::string decode(std::span<const token_id> ids,
                     render_special render = render_special::no) const;

  size_t n_vocab() const;
  pre_tokenizer pre() const;
  /// Stored (byte-level encoded) text of a token; empty for out-of-range ids.
  std::string_view token_text(token_id id) const;
  token_type type_of(token_id id) const;
  /// The id of the token whose stored text is `text`.
  std::optional<token_id> find_token(std::string_view text) const;

  std::optional<token_id> bos() const;
  std::optional<token_id> eos() const;
  /// Whether encode(add_special::yes) puts BOS first.
  bool adds_bos() const;
  /// True for tokens that end a generation: EOS, EOT and the usual end-of-turn control tokens
  /// (<|im_end|>, <|eot_id|>, <|endoftext|>, <|end|>, <end_of_turn>, ...).
  bool is_end_of_generation(token_id id) const;
  /// All end-of-generation ids, sorted.
  std::span<const token_id> end_of_generation_ids() const;

 private:
  struct impl;
  explicit tokenizer(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

/// Turns a stream of token ids into text, holding back the bytes of an incomplete UTF-8 character
/// until it is complete. Not thread-safe; borrows the tokenizer.
class detokenizer_stream {
 public:
  explicit detokenizer_stream(const tokenizer& tok, render_special render = render_special::no)
      : tok_(&tok), render_(render) {}

  /// Adds one token; returns the text that is now complete (possibly empty).
  std::string push(token_id id);
  /// Returns whatever is held back (an incomplete character at the end of the stream is emitted
  /// as U+FFFD) and resets.
  std::string finish();

 private:
  const tokenizer* tok_;
  render_special render_;
  std::string pending_;
};

}  // namespace weft::gpu
