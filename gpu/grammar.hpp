#pragma once
/// Grammar-constrained decoding (structured outputs, docs/serving.md): a GBNF-like grammar over
/// bytes, compiled to a pushdown recogniser; JSON Schema compiled to such a grammar; and the token
/// mask — which tokens of the vocabulary keep the output a valid prefix — computed over a byte trie
/// of the vocabulary and cached per recogniser state.
///
/// Grammar text (llama.cpp's GBNF, byte-level): `name ::= alternatives` rules, alternatives
/// separated by `|`, items: "literal" (escapes \n \r \t \\ \" \xHH, \uHHHH for ASCII), [classes]
/// with ranges and ^ negation (ASCII; a negated class admits every byte >= 0x80, so UTF-8 text
/// passes), rule names, ( groups ), postfix * + ? and {m}, {m,}, {m,n}; # comments. `root` is the
/// start rule. Matching is byte by byte: multi-byte characters are their UTF-8 bytes.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gpu/status.hpp"

namespace weft::gpu {
class tokenizer;
}

namespace weft::gpu::grammar {

/// One element of a compiled alternative.
struct element {
  enum class kind : uint8_t { bytes, rule, end };
  kind k = kind::end;
  int32_t rule = -1;                      ///< kind::rule
  std::vector<uint64_t> set{0, 0, 0, 0};  ///< kind::bytes: a 256-bit set of the bytes it matches
  bool matches(uint8_t b) const { return (set[b >> 6] >> (b & 63)) & 1u; }
};

/// A compiled grammar: rules of alternatives, each a run of elements ending with kind::end,
/// stored flat. Immutable once built; shared by every sequence that uses it.
class grammar {
 public:
  /// Parses GBNF text; errors name the line and what is wrong.
  static result<std::shared_ptr<const grammar>> parse(std::string_view text);

  /// Position of rule r's alternatives' first elements.
  const std::vector<int32_t>& alternatives(int32_t rule) const {
    return alts_[static_cast<size_t>(rule)];
  }
  const element& at(int32_t pos) const { return elems_[static_cast<size_t>(pos)]; }
  int32_t root() const { return root_; }
  size_t n_rules() const { return alts_.size(); }
  /// The rule names (index = rule id), for messages.
  const std::vector<std::string>& names() const { return names_; }

 private:
  friend class builder;
  std::vector<element> elems_;
  std::vector<std::vector<int32_t>> alts_;
  std::vector<std::string> names_;
  int32_t root_ = 0;
};

/// Where a recogniser can be: a set of stacks of element positions (the top is the next byte
/// element to match; below it, where to continue after the rules above end). An empty stack in
/// the set means the input so far is a complete sentence.
class matcher {
 public:
  explicit matcher(std::shared_ptr<const grammar> g);

  /// Consumes one byte; false (and no change) when no stack admits it.
  bool advance(uint8_t byte);
  /// Consumes bytes in order; false (state unchanged) if any is refused.
  bool advance(std::string_view bytes);
  /// The input so far is a complete sentence (the end of text may follow).
  bool accepting() const;
  /// Nothing but the end may follow.
  bool finished() const;
  /// A hash of the state (the mask cache's key).
  uint64_t state_hash() const;

  using stack = std::vector<int32_t>;
  const std::vector<stack>& stacks() const { return stacks_; }
  const grammar& rules() const { return *g_; }

  /// Stacks after consuming `byte` from `from` (may be empty).
  static void step(const grammar& g, const std::vector<stack>& from, uint8_t byte,
                   std::vector<stack>& out);

 private:
  std::shared_ptr<const grammar> g_;
  std::vector<stack> stacks_;
};

/// The vocabulary as a byte trie, built once per tokenizer; the mask of a matcher state walks it,
/// pruning at the first refused byte.
class token_trie {
 public:
  /// `pieces[i]` = the bytes of token i; empty pieces (control tokens) are never allowed by the
  /// grammar (the caller decides about end-of-text tokens).
  explicit token_trie(const std::vector<std::string>& pieces);
  /// The trie of a tokenizer's vocabulary (control tokens have no bytes: never allowed).
  static std::shared_ptr<const token_trie> of(const tokenizer& tok);

  /// allowed[i] = 1 for every token whose bytes the state admits in full. O(trie nodes visited).
  void mask(const matcher& m, std::vector<uint8_t>& allowed) const;
  size_t n_tokens() const { return pieces_.size(); }
  /// The bytes of token `id` ("" out of range).
  const std::string& piece(int32_t id) const;

 private:
  struct node {
    std::vector<std::pair<uint8_t, int32_t>> children;  ///< sorted by byte
    std::vector<int32_t> tokens;                        ///< tokens ending here
  };
  std::vector<node> nodes_;
  std::vector<std::string> pieces_;
};

/// The masks of one grammar over one vocabulary, by recogniser state: shared by every sequence
/// decoding under that grammar (an engine keeps one per grammar), so a state is computed once for
/// all of them. Bounded (cleared past 1024 states); a hit is checked against the stored state, so a
/// hash collision cannot return another state's mask. Not thread-safe.
class mask_cache {
 public:
  mask_cache(std::shared_ptr<const grammar> g, std::shared_ptr<const token_trie> trie);
  /// One bit per token (bit i of word i / 64): the tokens whose bytes the state admits in full.
  const std::vector<uint64_t>& bits(const matcher& m);
  const std::shared_ptr<const grammar>& rules() const { return g_; }
  const token_trie& vocab() const { return *trie_; }
  size_t size() const { return entries_.size(); }

 private:
  struct entry {
    std::vector<matcher::stack> stacks;
    std::vector<uint64_t> bits;
  };
  std::shared_ptr<const grammar> g_;
  std::shared_ptr<const token_trie> trie_;
  std::unordered_map<uint64_t, entry> entries_;
  std::vector<uint8_t> scratch_;
};

/// One sequence's constraint: its recogniser state and the (shared) mask cache. The `end` tokens
/// (the request's stop tokens) are allowed exactly when the text is a complete sentence.
class constraint {
 public:
  constraint(std::shared_ptr<mask_cache> cache, std::vector<int32_t> end_tokens);
  /// With a cache of its own (tests, tools).
  constraint(std::shared_ptr<const grammar> g, std::shared_ptr<const token_trie> trie,
             std::vector<int32_t> end_tokens);
  /// The grammar's bits for the current state (end tokens not included: see can_end).
  const std::vector<uint64_t>& bits() { return cache_->bits(m_); }
  bool can_end() const { return m_.accepting(); }
  const std::vector<int32_t>& end_tokens() const { return end_; }
  /// allowed[i] for every token, end tokens included (a convenience over bits()).
  const std::vector<uint8_t>& allowed();
  /// Feeds a sampled token's bytes (an end token: nothing). False if the grammar refuses them.
  bool accept(std::string_view piece);
  const matcher& state() const { return m_; }

 private:
  std::shared_ptr<mask_cache> cache_;
  matcher m_;
  std::vector<int32_t> end_;
  std::vector<uint8_t> allowed_;
};

/// GBNF for a JSON Schema (draft 2020-12 subset: type incl. arrays of types, properties/required,
/// items/prefixItems, minItems/maxItems, enum, const, anyOf/oneOf, $ref to #/$defs or
/// #/definitions, string minLength/maxLength, nullable by type). `additionalProperties` other than
/// false/absent-as-closed is refused. A keyword that would constrain the output in a way the
/// grammar cannot (pattern, format, minimum, maximum, multipleOf, uniqueItems, ...) is an
/// invalid_argument naming it. An empty schema (or {"type": "object"} with no properties) allows
/// any JSON value (object).
result<std::string> json_schema_to_gbnf(const std::string& schema_json);

/// GBNF for any JSON object (response_format json_object).
std::string json_object_gbnf();

}  // namespace weft::gpu::grammar
