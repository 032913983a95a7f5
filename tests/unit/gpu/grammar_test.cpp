// The grammar engine of structured outputs (gpu/grammar.hpp): GBNF parsing and its errors, the
// recogniser, the token mask against a brute-force check of every token, JSON Schema compilation.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu/grammar.hpp"

namespace {

using namespace weft::gpu;
using namespace weft::gpu::grammar;

std::shared_ptr<const grammar::grammar> parse_ok(const std::string& text) {
  auto g = grammar::grammar::parse(text);
  EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().to_string());
  return g.ok() ? *g : nullptr;
}

bool accepts(const std::shared_ptr<const grammar::grammar>& g, const std::string& s) {
  matcher m(g);
  return m.advance(s) && m.accepting();
}

bool prefix_ok(const std::shared_ptr<const grammar::grammar>& g, const std::string& s) {
  matcher m(g);
  return m.advance(s);
}

TEST(grammar, literals_classes_groups_and_repetition) {
  auto g = parse_ok(R"(root ::= "a" [0-9]+ ( "x" | "yz" )? tail
tail ::= [^a-c]{0,2}  # a comment
)");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(accepts(g, "a1"));
  EXPECT_TRUE(accepts(g, "a123yz"));
  EXPECT_TRUE(accepts(g, "a9x"));
  EXPECT_TRUE(accepts(g, "a9xdd"));
  EXPECT_TRUE(accepts(g, "a9\xc3\xa9"));  // a negated class admits UTF-8 bytes
  EXPECT_FALSE(accepts(g, "a"));
  EXPECT_TRUE(accepts(g, "a1y"));        // no group; 'y' from tail
  EXPECT_TRUE(prefix_ok(g, "a"));        // a prefix, not a sentence
  EXPECT_FALSE(prefix_ok(g, "a9xa"));    // 'a' is excluded from tail
  EXPECT_FALSE(prefix_ok(g, "a9xddd"));  // at most two
  EXPECT_FALSE(prefix_ok(g, "b"));
  matcher m(g);
  EXPECT_FALSE(m.advance(std::string("aX")));
  EXPECT_TRUE(m.advance(std::string("a")));  // a refused run leaves the state unchanged
}

TEST(grammar, errors_name_the_problem) {
  auto err = [](const std::string& text) {
    auto g = grammar::grammar::parse(text);
    EXPECT_FALSE(g.ok()) << text;
    return g.ok() ? std::string{} : g.error().message();
  };
  EXPECT_NE(err("root ::= missing").find("'missing' is used but not defined"), std::string::npos);
  EXPECT_NE(err("start ::= \"a\"").find("no 'root' rule"), std::string::npos);
  EXPECT_NE(err("root ::= root \"a\" | \"b\"").find("left-recursive"), std::string::npos);
  EXPECT_NE(err("root ::= \"a\"\nroot ::= \"b\"").find("line 2"), std::string::npos);
  EXPECT_NE(err("root ::= \"\\q\"").find("unknown escape"), std::string::npos);
  EXPECT_NE(err("root ::= [z-a]").find("empty range"), std::string::npos);
  EXPECT_NE(err("root ::= ( \"a\"").find("')'"), std::string::npos);
  EXPECT_NE(err("root ::= \"a\"{3,1}").find("n < m"), std::string::npos);
}

TEST(grammar, mask_equals_a_brute_force_check_of_every_token) {
  auto g = parse_ok(json_object_gbnf());
  ASSERT_NE(g, nullptr);
  std::vector<std::string> pieces;
  for (int b = 0; b < 256; ++b) pieces.emplace_back(1, static_cast<char>(b));
  std::mt19937 rng(3);
  const std::string alphabet = "{}[]\":, 0123456789.eE-+truefalsnl\\ab";
  for (int i = 0; i < 3000; ++i) {
    std::string t;
    const int len = 2 + static_cast<int>(rng() % 5);
    for (int j = 0; j < len; ++j) t += alphabet[rng() % alphabet.size()];
    pieces.push_back(t);
  }
  const token_trie trie(pieces);
  matcher m(g);
  std::vector<uint8_t> mask;
  // Along a valid document, at every byte.
  const std::string doc = R"({"a": [1, -2.5e3, true, null, {"b": "x\"y\u00e9"}], "c": {}})";
  for (size_t k = 0; k <= doc.size(); ++k) {
    trie.mask(m, mask);
    for (size_t t = 0; t < pieces.size(); ++t) {
      matcher copy = m;
      const bool ok = copy.advance(pieces[t]);
      ASSERT_EQ(mask[t] != 0, ok) << "at " << k << " token '" << pieces[t] << "'";
    }
    if (k < doc.size()) {
      ASSERT_TRUE(m.advance(static_cast<uint8_t>(doc[k]))) << k;
    }
  }
  EXPECT_TRUE(m.accepting());
}

TEST(grammar, constraint_allows_end_only_when_complete_and_caches_states) {
  auto g = parse_ok(R"(root ::= "[" ( "1" ( "," "1" )* )? "]")");
  ASSERT_NE(g, nullptr);
  std::vector<std::string> pieces = {"[", "]", "1", ",", "1,", "[]", "x", ""};
  const int32_t eos = 7;
  constraint c(g, std::make_shared<token_trie>(pieces), {eos});
  auto allowed = [&] {
    std::vector<std::string> out;
    const auto& m = c.allowed();
    for (size_t i = 0; i < m.size(); ++i)
      if (m[i] != 0) out.push_back(i == 7 ? "<eos>" : pieces[i]);
    return out;
  };
  EXPECT_EQ(allowed(), (std::vector<std::string>{"[", "[]"}));
  ASSERT_TRUE(c.accept("["));
  EXPECT_EQ(allowed(), (std::vector<std::string>{"]", "1", "1,"}));
  ASSERT_TRUE(c.accept("1,"));
  EXPECT_EQ(allowed(), (std::vector<std::string>{"1", "1,"}));
  ASSERT_TRUE(c.accept("1"));
  ASSERT_TRUE(c.accept("]"));
  EXPECT_EQ(allowed(), (std::vector<std::string>{"<eos>"}));
  EXPECT_FALSE(c.accept("x"));
}

TEST(grammar, json_schema_compiles_and_refuses_what_it_cannot_enforce) {
  auto gbnf = json_schema_to_gbnf(R"({"type": "object", "properties": {
      "name": {"type": "string"}, "n": {"type": "integer"}}, "required": ["name"]})");
  ASSERT_TRUE(gbnf.ok()) << gbnf.error().to_string();
  auto g = parse_ok(*gbnf);
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(accepts(g, R"({"name": "x", "n": 3})"));
  EXPECT_TRUE(accepts(g, R"({"name": "x"})"));
  EXPECT_FALSE(prefix_ok(g, R"({"n": 3)"));  // the required property comes first
  EXPECT_FALSE(prefix_ok(g, R"({"name": 1)"));
  for (const auto& [schema, keyword] : std::vector<std::pair<std::string, std::string>>{
           {R"({"type": "string", "pattern": "a+"})", "'pattern'"},
           {R"({"type": "integer", "maximum": 3})", "'maximum'"},
           {R"({"$ref": "http://example.com/s"})", "only #/$defs"},
           {R"({"$ref": "#/$defs/none"})", "names no definition"},
           {R"({"type": "object", "properties": {"a": {}}, "additionalProperties": true})",
            "'additionalProperties'"},
           {R"({"type": "thing"})", "unknown type"},
           {"{not json", "not JSON"}}) {
    auto r = json_schema_to_gbnf(schema);
    ASSERT_FALSE(r.ok()) << schema;
    EXPECT_EQ(r.error().code(), status_code::invalid_argument);
    EXPECT_NE(r.error().message().find(keyword), std::string::npos) << r.error().message();
  }
}

}  // namespace
