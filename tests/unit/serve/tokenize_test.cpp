// POST /tokenize and /detokenize (actors/serve/openai_api.hpp) as pure functions of a generated
// tiny model's tokenizer: both servers' request forms, pieces, messages through the chat template,
// bad bodies; the model object's context length. (tests/integration/serve/test_server_extras.py
// checks the default model's ids against llama.cpp.)
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "actors/serve/openai_api.hpp"
#include "gpu/gguf.hpp"
#include "gpu/tiny_model.hpp"

namespace weft::serve {
namespace {

using json = nlohmann::json;

/// A generated tiny model's tokenizer and chat template.
struct tiny_tokenizer {
  tiny_tokenizer() {
    auto img = gpu::make_tiny_model(gpu::tiny_model_config{});
    auto f = gpu::gguf_file::parse(*img);
    tok = std::make_unique<gpu::tokenizer>(std::move(gpu::tokenizer::from_gguf(*f).value()));
    auto t = gpu::chat_template::from_gguf(*f);
    if (t) tmpl = std::make_unique<gpu::chat_template>(std::move(*t));
  }
  std::unique_ptr<gpu::tokenizer> tok;
  std::unique_ptr<gpu::chat_template> tmpl;
};

TEST(tokenize, both_servers_forms_round_trip_through_detokenize) {
  tiny_tokenizer t;
  auto r = tokenize_request(R"({"content": "hello world"})", *t.tok, t.tmpl.get(), 4096);
  ASSERT_EQ(r.status, 200) << r.body;
  const auto j = json::parse(r.body);
  EXPECT_EQ(j["count"], j["tokens"].size());
  EXPECT_EQ(j["max_model_len"], 4096);
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(),
            t.tok->encode("hello world", gpu::add_special::no));  // llama-server: no BOS
  auto v = tokenize_request(R"({"prompt": "hello world"})", *t.tok, t.tmpl.get(), 4096);
  EXPECT_EQ(json::parse(v.body)["tokens"].get<std::vector<int32_t>>(),
            t.tok->encode("hello world", gpu::add_special::yes));  // vLLM: special tokens on
  const auto d = detokenize_request(json{{"tokens", j["tokens"]}}.dump(), *t.tok);
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(json::parse(d.body)["content"], "hello world");
  EXPECT_EQ(json::parse(d.body)["prompt"], "hello world");
  auto p = tokenize_request(R"({"content": "hello", "with_pieces": true})", *t.tok, nullptr, 1);
  std::string joined;
  ASSERT_EQ(p.status, 200) << p.body;
  const auto pieces = json::parse(p.body);
  for (const auto& x : pieces["tokens"]) joined += x["piece"].get<std::string>();
  EXPECT_EQ(joined, "hello") << p.body;
}

TEST(tokenize, bad_bodies_are_400_with_a_message) {
  tiny_tokenizer t;
  for (const char* body : {"{nope", "[1,2]", R"({"content": 7})", R"({"nothing": "x"})",
                           R"({"content": "x", "with_pieces": "yes"})"}) {
    const auto r = tokenize_request(body, *t.tok, t.tmpl.get(), 16);
    EXPECT_EQ(r.status, 400) << body;
    EXPECT_FALSE(json::parse(r.body)["error"]["message"].get<std::string>().empty()) << body;
  }
  // Messages need a chat template.
  EXPECT_EQ(
      tokenize_request(R"({"messages": [{"role": "user", "content": "hi"}]})", *t.tok, nullptr, 16)
          .status,
      400);
  for (const std::string& body : {std::string("{}"), std::string(R"({"tokens": [1, -1]})"),
                                  std::string(R"({"tokens": [1, 1.5]})"),
                                  R"({"tokens": [)" + std::to_string(t.tok->n_vocab()) + "]}"}) {
    const auto r = detokenize_request(body, *t.tok);
    EXPECT_EQ(r.status, 400) << body;
  }
}

TEST(tokenize, messages_render_with_the_template_like_the_chat_endpoint) {
  tiny_tokenizer t;
  ASSERT_NE(t.tmpl, nullptr);  // generated tiny models carry a chat template
  const auto r = tokenize_request(R"({"messages": [{"role": "user", "content": "hi"}]})", *t.tok,
                                  t.tmpl.get(), 64);
  ASSERT_EQ(r.status, 200) << r.body;
  const gpu::chat_message m{"user", "hi"};
  const auto text = t.tmpl->apply(std::span(&m, 1), gpu::generation_prompt::add);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(json::parse(r.body)["tokens"].get<std::vector<int32_t>>(),
            t.tok->encode(*text, gpu::add_special::yes, gpu::parse_special::yes));
}

TEST(tokenize, the_model_object_carries_its_context_length) {
  const auto j = json::parse(render_model("m", 7, 2048));
  EXPECT_EQ(j["id"], "m");
  EXPECT_EQ(j["object"], "model");
  EXPECT_EQ(j["max_model_len"], 2048);
}

}  // namespace
}  // namespace weft::serve
