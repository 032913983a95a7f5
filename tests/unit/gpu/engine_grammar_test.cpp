// Structured outputs in the engine: every sampled token keeps the text a valid prefix of the
// request's grammar, the stop token comes exactly when the text is complete, and a request resumed
// elsewhere (migration) continues under the grammar with the same tokens as an undisturbed run.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/engine.hpp"
#include "gpu/gguf.hpp"
#include "gpu/grammar.hpp"
#include "gpu/model.hpp"
#include "gpu/tiny_model.hpp"
#include "gpu/tokenizer.hpp"

namespace {

using namespace weft::gpu;

struct fixture {
  std::unique_ptr<device> dev;
  std::unique_ptr<model> m;
  std::unique_ptr<tokenizer> tok;
  std::shared_ptr<const grammar::token_trie> trie;
};

fixture load() {
  fixture f;
  tiny_model_config c;
  c.n_vocab = 600;
  auto img = make_tiny_model(c);
  EXPECT_TRUE(img.ok());
  f.dev = std::move(device_registry::instance().create("cpu", device_config{1, 0}).value());
  auto file = gguf_file::parse(*img);
  auto tk = tokenizer::from_gguf(*file);
  EXPECT_TRUE(tk.ok());
  f.tok = std::make_unique<tokenizer>(std::move(*tk));
  f.trie = grammar::token_trie::of(*f.tok);
  auto mm = model::load(std::move(*file), *f.dev);
  EXPECT_TRUE(mm.ok());
  f.m = std::move(*mm);
  return f;
}

const char* kGrammar = R"(root ::= "{\"n\": " [1-9] [0-9]{0,3} ", \"w\": \"" [a-z ]{1,12} "\"}")";

std::vector<request_output> run_all(engine& e) {
  std::vector<request_output> all;
  while (e.has_work()) {
    auto outs = e.step();
    EXPECT_TRUE(outs.ok());
    if (!outs.ok()) break;
    for (auto& o : *outs) all.push_back(std::move(o));
  }
  return all;
}

sampling_params params_for(const fixture& f, uint64_t seed) {
  sampling_params p;
  p.temperature = 1.0f;  // random draws: the mask, not the model, keeps the text valid
  p.seed = seed;
  p.max_tokens = 200;
  p.stop_tokens = {*f.tok->eos()};
  p.grammar = kGrammar;
  return p;
}

TEST(engine_grammar, sampled_text_matches_the_grammar_and_ends_with_the_stop_token) {
  auto f = load();
  engine_config ec;
  ec.vocab = f.trie;
  auto e = engine::create(*f.m, ec);
  ASSERT_TRUE(e.ok());
  auto g = grammar::grammar::parse(kGrammar);
  ASSERT_TRUE(g.ok());
  const auto prompt = f.tok->encode("Give me JSON:");
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    ASSERT_TRUE((*e)->add_request(seed, prompt, params_for(f, seed)).ok());
  }
  std::map<uint64_t, std::vector<int32_t>> toks;
  std::map<uint64_t, finish_reason> fin;
  for (auto& o : run_all(**e)) {
    toks[o.id].insert(toks[o.id].end(), o.new_tokens.begin(), o.new_tokens.end());
    if (o.finish != finish_reason::none) fin[o.id] = o.finish;
    EXPECT_TRUE(o.error.empty()) << o.error;
  }
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    const std::string text = f.tok->decode(toks[seed]);
    grammar::matcher m(*g);
    EXPECT_TRUE(m.advance(text) && m.accepting()) << text;
    EXPECT_EQ(fin[seed], finish_reason::stop_token) << text;
  }
  // Without the vocabulary the engine refuses a grammar instead of ignoring it.
  auto plain = engine::create(*f.m, engine_config{});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->add_request(99, prompt, params_for(f, 1)).code(), status_code::unsupported);
  auto bad = params_for(f, 1);
  bad.grammar = "root ::= nothing";
  EXPECT_EQ((*e)->add_request(98, prompt, bad).code(), status_code::invalid_argument);
}

TEST(engine_grammar, a_resumed_request_continues_under_the_grammar_exactly) {
  auto f = load();
  engine_config ec;
  ec.vocab = f.trie;
  const auto prompt = f.tok->encode("JSON please:");
  auto whole = [&](engine& e) {
    EXPECT_TRUE(e.add_request(1, prompt, params_for(f, 7)).ok());
    std::vector<int32_t> out;
    for (auto& o : run_all(e)) out.insert(out.end(), o.new_tokens.begin(), o.new_tokens.end());
    return out;
  };
  auto e1 = engine::create(*f.m, ec);
  ASSERT_TRUE(e1.ok());
  const auto reference = whole(**e1);
  ASSERT_GE(reference.size(), 6u);
  // Migrated after 4 tokens: the new engine gets prompt + those 4 and must continue identically.
  auto e2 = engine::create(*f.m, ec);
  ASSERT_TRUE(e2.ok());
  std::vector<int32_t> resumed = prompt;
  resumed.insert(resumed.end(), reference.begin(), reference.begin() + 4);
  auto p = params_for(f, 7);
  p.max_tokens = 200 - 4;
  ASSERT_TRUE((*e2)->add_resumed_request(2, resumed, 4, p).ok());
  std::vector<int32_t> rest;
  for (auto& o : run_all(**e2)) rest.insert(rest.end(), o.new_tokens.begin(), o.new_tokens.end());
  std::vector<int32_t> joined(reference.begin(), reference.begin() + 4);
  joined.insert(joined.end(), rest.begin(), rest.end());
  EXPECT_EQ(joined, reference);
  // Replayed tokens that break the grammar are refused.
  std::vector<int32_t> wrong = prompt;
  const auto x = f.tok->encode("x");
  wrong.insert(wrong.end(), x.begin(), x.end());
  EXPECT_EQ((*e2)->add_resumed_request(3, wrong, static_cast<int64_t>(x.size()), p).code(),
            status_code::invalid_argument);
}

}  // namespace
