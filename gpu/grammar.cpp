#include "gpu/grammar.hpp"

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <set>

#include "gpu/tokenizer.hpp"

namespace weft::gpu::grammar {

namespace {

using byteset = std::vector<uint64_t>;

byteset empty_set() {
  return byteset(4, 0);
}
void set_byte(byteset& s, unsigned b) {
  s[b >> 6] |= uint64_t{1} << (b & 63);
}

/// One item of an alternative while building: a byte set or a rule reference.
struct spec {
  bool is_rule = false;
  int32_t rule = -1;
  byteset set;
};
using sequence = std::vector<spec>;

constexpr size_t kMaxExpandDepth = 512;
constexpr size_t kMaxStackSize = 4096;

}  // namespace

/// Builds a grammar: named and synthetic rules, their alternatives, then flattening.
class builder {
 public:
  int32_t rule_id(const std::string& name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const auto id = static_cast<int32_t>(rules_.size());
    ids_[name] = id;
    rules_.emplace_back();
    names_.push_back(name);
    defined_.push_back(false);
    return id;
  }
  int32_t synthetic(const std::string& base, std::vector<sequence> alts) {
    const int32_t id = rule_id(base + "#" + std::to_string(rules_.size()));
    rules_[static_cast<size_t>(id)] = std::move(alts);
    defined_[static_cast<size_t>(id)] = true;
    return id;
  }
  std::vector<std::vector<sequence>> rules_;
  std::vector<std::string> names_;
  std::vector<bool> defined_;
  std::map<std::string, int32_t> ids_;

  result<std::shared_ptr<const grammar>> finish() {
    for (size_t i = 0; i < rules_.size(); ++i) {
      if (!defined_[i])
        return status{status_code::invalid_argument,
                      "grammar: rule '" + names_[i] + "' is used but not defined"};
    }
    auto it = ids_.find("root");
    if (it == ids_.end()) return status{status_code::invalid_argument, "grammar: no 'root' rule"};
    auto g = std::make_shared<grammar>();
    g->names_ = names_;
    g->root_ = it->second;
    g->alts_.resize(rules_.size());
    for (size_t r = 0; r < rules_.size(); ++r) {
      for (const auto& seq : rules_[r]) {
        g->alts_[r].push_back(static_cast<int32_t>(g->elems_.size()));
        for (const auto& s : seq) {
          element e;
          if (s.is_rule) {
            e.k = element::kind::rule;
            e.rule = s.rule;
          } else {
            e.k = element::kind::bytes;
            e.set = s.set;
          }
          g->elems_.push_back(std::move(e));
        }
        g->elems_.push_back(element{});  // end
      }
    }
    // Left recursion would expand forever: refuse it (a rule reachable from itself without
    // consuming a byte).
    std::vector<uint8_t> nullable(rules_.size(), 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < rules_.size(); ++r) {
        if (nullable[r]) continue;
        for (const auto& seq : rules_[r]) {
          const bool all = std::all_of(seq.begin(), seq.end(), [&](const spec& s) {
            return s.is_rule && nullable[static_cast<size_t>(s.rule)];
          });
          if (all) {
            nullable[r] = 1;
            changed = true;
            break;
          }
        }
      }
    }
    // first-edges: r -> rules that can start r.
    std::vector<std::vector<int32_t>> first(rules_.size());
    for (size_t r = 0; r < rules_.size(); ++r) {
      for (const auto& seq : rules_[r]) {
        for (const auto& s : seq) {
          if (!s.is_rule) break;
          first[r].push_back(s.rule);
          if (!nullable[static_cast<size_t>(s.rule)]) break;
        }
      }
    }
    std::vector<uint8_t> colour(rules_.size(), 0);
    std::string cycle;
    std::function<bool(int32_t)> dfs = [&](int32_t r) {
      colour[static_cast<size_t>(r)] = 1;
      for (int32_t n : first[static_cast<size_t>(r)]) {
        if (colour[static_cast<size_t>(n)] == 1) {
          cycle = names_[static_cast<size_t>(n)];
          return true;
        }
        if (colour[static_cast<size_t>(n)] == 0 && dfs(n)) return true;
      }
      colour[static_cast<size_t>(r)] = 2;
      return false;
    };
    for (size_t r = 0; r < rules_.size(); ++r) {
      if (colour[r] == 0 && dfs(static_cast<int32_t>(r)))
        return status{status_code::invalid_argument,
                      "grammar: rule '" + cycle.substr(0, cycle.find('#')) + "' is left-recursive"};
    }
    return std::shared_ptr<const grammar>(std::move(g));
  }
};

namespace {

/// Recursive-descent GBNF parser.
class parser {
 public:
  parser(std::string_view text, builder& b) : t_(text), b_(b) {}

  status run() {
    skip();
    while (p_ < t_.size()) {
      std::string name = ident();
      if (name.empty()) return err("expected a rule name");
      skip();
      if (t_.substr(p_, 3) != "::=") return err("expected '::=' after '" + name + "'");
      p_ += 3;
      const int32_t id = b_.rule_id(name);
      if (b_.defined_[static_cast<size_t>(id)]) return err("rule '" + name + "' is defined twice");
      std::vector<sequence> alts;
      if (auto st = alternatives(alts, name, false); !st) return st;
      b_.rules_[static_cast<size_t>(id)] = std::move(alts);
      b_.defined_[static_cast<size_t>(id)] = true;
      skip();
    }
    return {};
  }

 private:
  status err(const std::string& what) const {
    const size_t line =
        1 +
        static_cast<size_t>(std::count(
            t_.begin(), t_.begin() + static_cast<std::ptrdiff_t>(std::min(p_, t_.size())), '\n'));
    return {status_code::invalid_argument, "grammar line " + std::to_string(line) + ": " + what};
  }
  // Skips spaces, tabs, comments; newlines too unless `stop_at_newline` and the next line does
  // not continue the rule (a rule ends at a newline followed by `name ::=`).
  void skip() {
    while (p_ < t_.size()) {
      const char c = t_[p_];
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        ++p_;
      } else if (c == '#') {
        while (p_ < t_.size() && t_[p_] != '\n') ++p_;
      } else {
        break;
      }
    }
  }
  static bool ident_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
  }
  std::string ident() {
    const size_t s = p_;
    while (p_ < t_.size() && ident_char(t_[p_])) ++p_;
    return std::string{t_.substr(s, p_ - s)};
  }
  // True when the text at p_ starts a new rule (`name ::=`).
  bool at_rule_start() const {
    size_t q = p_;
    while (q < t_.size() && ident_char(t_[q])) ++q;
    if (q == p_) return false;
    while (q < t_.size() && (t_[q] == ' ' || t_[q] == '\t')) ++q;
    return t_.substr(q, 3) == "::=";
  }
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  // One (possibly escaped) byte inside a literal or class.
  result<unsigned> char_at() {
    if (p_ >= t_.size()) return err("unexpected end of grammar");
    const char c = t_[p_++];
    if (c != '\\') return static_cast<unsigned>(static_cast<unsigned char>(c));
    if (p_ >= t_.size()) return err("dangling '\\'");
    const char e = t_[p_++];
    switch (e) {
      case 'n':
        return 10u;
      case 'r':
        return 13u;
      case 't':
        return 9u;
      case '\\':
        return 92u;
      case '"':
        return 34u;
      case '\'':
        return 39u;
      case ']':
        return 93u;
      case '[':
        return 91u;
      case '-':
        return 45u;
      case '^':
        return 94u;
      case 'x':
      case 'u': {
        const int digits = e == 'x' ? 2 : 4;
        unsigned v = 0;
        for (int i = 0; i < digits; ++i) {
          if (p_ >= t_.size() || hex(t_[p_]) < 0)
            return err("bad \\" + std::string(1, e) + " escape");
          v = v * 16 + static_cast<unsigned>(hex(t_[p_++]));
        }
        if (v > 255 || (e == 'u' && v > 127))
          return err("escape \\" + std::string(1, e) +
                     " beyond ASCII: write the character's UTF-8 bytes");
        return v;
      }
      default:
        return err(std::string{"unknown escape \\"} + e);
    }
  }

  status alternatives(std::vector<sequence>& alts, const std::string& name, bool nested) {
    alts.emplace_back();
    for (;;) {
      // Within a rule, whitespace and newlines separate items; a newline followed by `x ::=`
      // ends the rule.
      skip();
      if (p_ >= t_.size()) break;
      if (!nested && at_rule_start()) break;
      const char c = t_[p_];
      if (c == '|') {
        ++p_;
        alts.emplace_back();
        continue;
      }
      if (c == ')') {
        if (!nested) return err("unbalanced ')'");
        break;
      }
      spec item;
      if (c == '"') {
        ++p_;
        sequence lit;
        while (p_ < t_.size() && t_[p_] != '"') {
          auto ch = char_at();
          if (!ch) return ch.error();
          spec s;
          s.set = empty_set();
          set_byte(s.set, *ch);
          lit.push_back(std::move(s));
        }
        if (p_ >= t_.size()) return err("unterminated string literal");
        ++p_;
        if (lit.size() == 1) {
          item = lit[0];
        } else {
          item.is_rule = true;
          item.rule = b_.synthetic(name, {lit});
        }
      } else if (c == '[') {
        ++p_;
        bool negate = false;
        if (p_ < t_.size() && t_[p_] == '^') {
          negate = true;
          ++p_;
        }
        byteset s = empty_set();
        while (p_ < t_.size() && t_[p_] != ']') {
          auto lo = char_at();
          if (!lo) return lo.error();
          unsigned hi = *lo;
          if (p_ + 1 < t_.size() && t_[p_] == '-' && t_[p_ + 1] != ']') {
            ++p_;
            auto h = char_at();
            if (!h) return h.error();
            hi = *h;
          }
          if (hi < *lo) return err("empty range in character class");
          if (*lo > 127 || hi > 127)
            return err("character classes are ASCII only (write other characters as literals)");
          for (unsigned v = *lo; v <= hi; ++v) set_byte(s, v);
        }
        if (p_ >= t_.size()) return err("unterminated character class");
        ++p_;
        if (negate)
          for (auto& w : s) w = ~w;
        item.set = std::move(s);
      } else if (c == '(') {
        ++p_;
        std::vector<sequence> inner;
        if (auto st = alternatives(inner, name, true); !st) return st;
        if (p_ >= t_.size() || t_[p_] != ')') return err("missing ')'");
        ++p_;
        item.is_rule = true;
        item.rule = b_.synthetic(name, std::move(inner));
      } else if (ident_char(c)) {
        const std::string ref = ident();
        item.is_rule = true;
        item.rule = b_.rule_id(ref);
      } else {
        return err(std::string{"unexpected '"} + c + "'");
      }
      // Postfix operators.
      if (p_ < t_.size() && (t_[p_] == '*' || t_[p_] == '+' || t_[p_] == '?' || t_[p_] == '{')) {
        const char op = t_[p_++];
        int64_t lo = 0, hi = -1;
        if (op == '+') lo = 1;
        if (op == '?') hi = 1;
        if (op == '{') {
          auto num = [&]() -> int64_t {
            const size_t s = p_;
            while (p_ < t_.size() && t_[p_] >= '0' && t_[p_] <= '9') ++p_;
            return p_ == s ? -1
                           : std::stoll(std::string{t_.substr(s, std::min<size_t>(p_ - s, 6))});
          };
          lo = num();
          if (lo < 0) return err("expected a number after '{'");
          hi = lo;
          if (p_ < t_.size() && t_[p_] == ',') {
            ++p_;
            hi = num();  // -1: unbounded
          }
          if (p_ >= t_.size() || t_[p_] != '}') return err("expected '}'");
          ++p_;
          if (hi >= 0 && hi < lo) return err("repetition {m,n} with n < m");
          if (lo > 1000 || hi > 1000) return err("repetition counts above 1000");
        }
        for (int64_t i = 0; i < lo; ++i) alts.back().push_back(item);
        if (hi < 0) {
          // item* : R ::= item R | ε
          const int32_t r = b_.rule_id(name + "#star" + std::to_string(b_.rules_.size()));
          b_.rules_[static_cast<size_t>(r)] = {sequence{item, spec{true, r, {}}}, sequence{}};
          b_.defined_[static_cast<size_t>(r)] = true;
          alts.back().push_back(spec{true, r, {}});
        } else {
          // (hi - lo) nested optionals: O_k ::= item O_{k+1} | ε.
          int32_t next = -1;
          for (int64_t k = hi - lo; k > 0; --k) {
            sequence with{item};
            if (next >= 0) with.push_back(spec{true, next, {}});
            next = b_.synthetic(name, {with, sequence{}});
          }
          if (next >= 0) alts.back().push_back(spec{true, next, {}});
        }
      } else {
        alts.back().push_back(std::move(item));
      }
    }
    return {};
  }

  std::string_view t_;
  size_t p_ = 0;
  builder& b_;
};

/// Expands rule references at the top of `s` until every resulting stack has a byte element on
/// top (or is empty: accepting), appending them to `out`.
void expand(const grammar& g, matcher::stack& s, std::vector<matcher::stack>& out, size_t depth) {
  if (depth > kMaxExpandDepth || s.size() > kMaxStackSize) return;
  if (s.empty()) {
    out.push_back(s);
    return;
  }
  const int32_t top = s.back();
  const element& e = g.at(top);
  if (e.k == element::kind::bytes) {
    out.push_back(s);
    return;
  }
  s.pop_back();
  if (e.k == element::kind::end) {
    expand(g, s, out, depth + 1);
    s.push_back(top);
    return;
  }
  const bool has_next = g.at(top + 1).k != element::kind::end;
  if (has_next) s.push_back(top + 1);
  for (int32_t a : g.alternatives(e.rule)) {
    if (g.at(a).k != element::kind::end) {
      s.push_back(a);
      expand(g, s, out, depth + 1);
      s.pop_back();
    } else {
      expand(g, s, out, depth + 1);
    }
  }
  if (has_next) s.pop_back();
  s.push_back(top);
}

void normalise(std::vector<matcher::stack>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

}  // namespace

result<std::shared_ptr<const grammar>> grammar::parse(std::string_view text) {
  builder b;
  parser p(text, b);
  if (auto st = p.run(); !st) return st;
  return b.finish();
}

matcher::matcher(std::shared_ptr<const grammar> g) : g_(std::move(g)) {
  stack s;
  for (int32_t a : g_->alternatives(g_->root())) {
    if (g_->at(a).k != element::kind::end) {
      s.push_back(a);
      expand(*g_, s, stacks_, 0);
      s.pop_back();
    } else {
      stacks_.push_back({});
    }
  }
  normalise(stacks_);
}

void matcher::step(const grammar& g, const std::vector<stack>& from, uint8_t byte,
                   std::vector<stack>& out) {
  out.clear();
  stack s;
  for (const stack& st : from) {
    if (st.empty()) continue;
    const int32_t top = st.back();
    if (!g.at(top).matches(byte)) continue;
    s.assign(st.begin(), st.end() - 1);
    if (g.at(top + 1).k != element::kind::end) s.push_back(top + 1);
    expand(g, s, out, 0);
  }
  normalise(out);
}

bool matcher::advance(uint8_t byte) {
  std::vector<stack> next;
  step(*g_, stacks_, byte, next);
  if (next.empty()) return false;
  stacks_ = std::move(next);
  return true;
}

bool matcher::advance(std::string_view bytes) {
  std::vector<stack> cur = stacks_, next;
  for (char c : bytes) {
    step(*g_, cur, static_cast<uint8_t>(c), next);
    if (next.empty()) return false;
    cur.swap(next);
  }
  stacks_ = std::move(cur);
  return true;
}

bool matcher::accepting() const {
  return std::any_of(stacks_.begin(), stacks_.end(), [](const stack& s) { return s.empty(); });
}

bool matcher::finished() const {
  return std::all_of(stacks_.begin(), stacks_.end(), [](const stack& s) { return s.empty(); });
}

uint64_t matcher::state_hash() const {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  for (const stack& s : stacks_) {
    mix(s.size());
    for (int32_t x : s) mix(static_cast<uint64_t>(static_cast<uint32_t>(x)));
  }
  return h;
}

const std::string& token_trie::piece(int32_t id) const {
  static const std::string none;
  return id >= 0 && static_cast<size_t>(id) < pieces_.size() ? pieces_[static_cast<size_t>(id)]
                                                             : none;
}

std::shared_ptr<const token_trie> token_trie::of(const tokenizer& tok) {
  std::vector<std::string> pieces(tok.n_vocab());
  for (size_t i = 0; i < pieces.size(); ++i)
    pieces[i] = tok.token_to_piece(static_cast<token_id>(i));
  return std::make_shared<const token_trie>(pieces);
}

token_trie::token_trie(const std::vector<std::string>& pieces) : pieces_(pieces) {
  nodes_.emplace_back();
  for (size_t t = 0; t < pieces.size(); ++t) {
    const std::string& p = pieces[t];
    if (p.empty()) continue;
    int32_t n = 0;
    for (char c : p) {
      const auto b = static_cast<uint8_t>(c);
      auto& ch = nodes_[static_cast<size_t>(n)].children;
      auto it = std::lower_bound(
          ch.begin(), ch.end(), b,
          [](const std::pair<uint8_t, int32_t>& a, uint8_t v) { return a.first < v; });
      if (it != ch.end() && it->first == b) {
        n = it->second;
      } else {
        const auto id = static_cast<int32_t>(nodes_.size());
        ch.insert(it, {b, id});
        nodes_.emplace_back();
        n = id;
      }
    }
    nodes_[static_cast<size_t>(n)].tokens.push_back(static_cast<int32_t>(t));
  }
}

void token_trie::mask(const matcher& m, std::vector<uint8_t>& allowed) const {
  allowed.assign(pieces_.size(), 0);
  const grammar& g = m.rules();
  // Depth-first over the trie. Many nodes see the same state (inside a string every character
  // leads back to it), so each (state, byte) step is computed once per walk and the states are
  // shared: a node's children are stepped from its state by lookup.
  struct state_entry {
    std::vector<matcher::stack> stacks;
    uint64_t hash = 0;
    std::array<const state_entry*, 256> next{};  ///< Filled as bytes are stepped.
    std::array<bool, 256> known{};
  };
  std::unordered_map<uint64_t, std::vector<std::unique_ptr<state_entry>>> states;
  auto hash_of = [](const std::vector<matcher::stack>& st) {
    uint64_t h = 1469598103934665603ull;
    for (const auto& s : st) {
      h = (h ^ s.size()) * 1099511628211ull;
      for (int32_t x : s) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
    }
    return h;
  };
  auto intern = [&](std::vector<matcher::stack>&& st) -> const state_entry* {
    const uint64_t h = hash_of(st);
    auto& bucket = states[h];
    for (const auto& e : bucket) {
      if (e->stacks == st) return e.get();
    }
    auto e = std::make_unique<state_entry>();
    e->stacks = std::move(st);
    e->hash = h;
    bucket.push_back(std::move(e));
    return bucket.back().get();
  };
  std::vector<matcher::stack> scratch;
  std::function<void(int32_t, const state_entry*)> walk = [&](int32_t node, const state_entry* st) {
    for (const auto& [b, child] : nodes_[static_cast<size_t>(node)].children) {
      auto* se = const_cast<state_entry*>(st);
      if (!se->known[b]) {
        matcher::step(g, se->stacks, b, scratch);
        se->next[b] = scratch.empty() ? nullptr : intern(std::move(scratch));
        se->known[b] = true;
        scratch.clear();
      }
      const state_entry* next = se->next[b];
      if (next == nullptr) continue;
      for (int32_t t : nodes_[static_cast<size_t>(child)].tokens)
        allowed[static_cast<size_t>(t)] = 1;
      walk(child, next);
    }
  };
  std::vector<matcher::stack> start = m.stacks();
  walk(0, intern(std::move(start)));
}

mask_cache::mask_cache(std::shared_ptr<const grammar> g, std::shared_ptr<const token_trie> trie)
    : g_(std::move(g)), trie_(std::move(trie)) {}

const std::vector<uint64_t>& mask_cache::bits(const matcher& m) {
  const uint64_t key = m.state_hash();
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.stacks == m.stacks()) return it->second.bits;
  if (entries_.size() >= 1024) entries_.clear();
  entry e;
  e.stacks = m.stacks();
  e.bits.assign((trie_->n_tokens() + 63) / 64, 0);
  if (!m.finished()) {
    trie_->mask(m, scratch_);
    for (size_t i = 0; i < scratch_.size(); ++i) {
      if (scratch_[i] != 0) e.bits[i >> 6] |= uint64_t{1} << (i & 63);
    }
  }
  auto& slot = entries_[key];  // a collision replaces the other state's entry
  slot = std::move(e);
  return slot.bits;
}

constraint::constraint(std::shared_ptr<mask_cache> cache, std::vector<int32_t> end_tokens)
    : cache_(std::move(cache)), m_(cache_->rules()), end_(std::move(end_tokens)) {}

constraint::constraint(std::shared_ptr<const grammar> g, std::shared_ptr<const token_trie> trie,
                       std::vector<int32_t> end_tokens)
    : constraint(std::make_shared<mask_cache>(std::move(g), std::move(trie)),
                 std::move(end_tokens)) {}

const std::vector<uint8_t>& constraint::allowed() {
  const auto& b = bits();
  allowed_.assign(cache_->vocab().n_tokens(), 0);
  for (size_t i = 0; i < allowed_.size(); ++i) allowed_[i] = (b[i >> 6] >> (i & 63)) & 1u;
  const bool end = can_end();
  for (int32_t e : end_) {
    if (e >= 0 && static_cast<size_t>(e) < allowed_.size())
      allowed_[static_cast<size_t>(e)] = end ? 1 : 0;
  }
  return allowed_;
}

bool constraint::accept(std::string_view piece) {
  return piece.empty() || m_.advance(piece);
}

}  // namespace weft::gpu::grammar
