#include <gtest/gtest.h>

#include <random>

#include "gguf_test_util.hpp"
#include "gpu/gguf.hpp"
#include "gpu/gguf_writer.hpp"
#include "gpu/tiny_model.hpp"
#include "gpu/tokenizer.hpp"

namespace weft::gpu {
namespace {

tokenizer tiny_tokenizer(uint32_t n_vocab = 384) {
  auto v = tiny_vocabulary(n_vocab);
  EXPECT_TRUE(v.ok());
  auto t = tokenizer::from_vocabulary(std::move(v).value());
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().message());
  return std::move(t).value();
}

std::vector<std::string> pieces(const tokenizer& t, const std::vector<token_id>& ids) {
  std::vector<std::string> out;
  for (token_id id : ids) out.push_back(t.token_to_piece(id, render_special::yes));
  return out;
}

TEST(tokenizer, tiny_model_round_trips_any_utf8) {
  const auto t = tiny_tokenizer();
  for (std::string text : {"Hello world", "The worker reads the prompt.", "  spaces \n\n tabs\t",
                           "日本語 😀 café", "x = 12345;", ""}) {
    const auto ids = t.encode(text);
    EXPECT_EQ(t.decode(ids), text);
  }
  // Merges make common words shorter than their bytes.
  EXPECT_LT(t.encode("the worker and the request").size(), 20u);
}

TEST(tokenizer, from_gguf_of_tiny_model) {
  const auto bytes = make_tiny_model({}).value();
  const auto f = gguf_file::parse(bytes).value();
  auto t = tokenizer::from_gguf(f);
  ASSERT_TRUE(t.ok()) << t.error().message();
  EXPECT_EQ(t->n_vocab(), 384u);
  EXPECT_EQ(t->pre(), pre_tokenizer::smollm);
  EXPECT_EQ(t->bos(), 1);
  EXPECT_EQ(t->eos(), 2);
  EXPECT_TRUE(t->is_end_of_generation(2));  // <|im_end|>
  EXPECT_TRUE(t->is_end_of_generation(0));  // <|endoftext|>
  EXPECT_FALSE(t->is_end_of_generation(1));
  EXPECT_EQ(t->type_of(1), token_type::control);
}

TEST(tokenizer, digits_are_split_one_by_one_for_smollm) {
  const auto t = tiny_tokenizer();
  const auto ids = t.encode("2024");
  EXPECT_EQ(pieces(t, ids), (std::vector<std::string>{"2", "0", "2", "4"}));
  const auto spaced = t.encode("a 12");
  EXPECT_EQ(pieces(t, spaced).back(), "2");
}

TEST(tokenizer, special_tokens_only_when_parsing_is_asked) {
  const auto t = tiny_tokenizer();
  const std::string text = "<|im_start|>user\nhi<|im_end|>";
  const auto parsed = t.encode(text, add_special::yes, parse_special::yes);
  ASSERT_GE(parsed.size(), 3u);
  EXPECT_EQ(parsed.front(), 1);
  EXPECT_EQ(parsed.back(), 2);
  const auto plain = t.encode(text, add_special::yes, parse_special::no);
  for (token_id id : plain) EXPECT_NE(t.type_of(id), token_type::control);
  EXPECT_EQ(t.decode(plain), text);
  // Control tokens decode to nothing unless rendering is asked.
  EXPECT_EQ(t.decode(parsed), "user\nhi");
  EXPECT_EQ(t.decode(parsed, render_special::yes), text);
}

TEST(tokenizer, bos_and_eos_follow_the_metadata) {
  auto v = tiny_vocabulary(300).value();
  v.add_bos = true;
  v.add_eos = true;
  const auto t = tokenizer::from_vocabulary(std::move(v)).value();
  const auto ids = t.encode("hi");
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids.back(), 2);
  const auto bare = t.encode("hi", add_special::no);
  EXPECT_NE(bare.front(), 1);
}

TEST(tokenizer, invalid_utf8_becomes_replacement_character) {
  const auto t = tiny_tokenizer();
  const auto ids =
      t.encode(std::string("a\xff"
                           "b"));
  EXPECT_EQ(t.decode(ids),
            "a\xEF\xBF\xBD"
            "b");
}

TEST(tokenizer, rejects_inconsistent_vocabularies) {
  auto v = tiny_vocabulary(300).value();
  v.types.pop_back();
  EXPECT_FALSE(tokenizer::from_vocabulary(v).ok());
  v = tiny_vocabulary(300).value();
  v.eos = 5000;
  EXPECT_FALSE(tokenizer::from_vocabulary(v).ok());
  v = tiny_vocabulary(300).value();
  v.merges.push_back("nospace");
  EXPECT_FALSE(tokenizer::from_vocabulary(v).ok());
  EXPECT_FALSE(tokenizer::from_vocabulary(tokenizer::vocabulary{}).ok());
}

TEST(tokenizer, from_gguf_errors_name_the_key) {
  gguf_writer w;
  w.set("tokenizer.ggml.model", "llama");
  auto f = gguf_file::parse(w.to_bytes().value()).value();
  auto t = tokenizer::from_gguf(f);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code(), status_code::unsupported);
  gguf_writer w2;
  w2.set("tokenizer.ggml.model", "gpt2");
  w2.set("tokenizer.ggml.tokens", make_array(std::vector<std::string>{"a", "b"}));
  auto f2 = gguf_file::parse(w2.to_bytes().value()).value();
  auto t2 = tokenizer::from_gguf(f2);
  ASSERT_FALSE(t2.ok());
  EXPECT_NE(t2.error().message().find("tokenizer.ggml.merges"), std::string::npos);
  w2.set("tokenizer.ggml.merges", make_array(std::vector<std::string>{"a b"}));
  w2.set("tokenizer.ggml.pre", "klingon");
  auto f3 = gguf_file::parse(w2.to_bytes().value()).value();
  auto t3 = tokenizer::from_gguf(f3);
  ASSERT_FALSE(t3.ok());
  EXPECT_NE(t3.error().message().find("klingon"), std::string::npos);
  auto forced = tokenizer::from_gguf(f3, tokenizer_options{pre_tokenizer::gpt2});
  EXPECT_TRUE(forced.ok());
}

TEST(detokenizer_stream, never_emits_half_a_character) {
  const auto t = tiny_tokenizer();
  const std::string text = "a😀b日本c";
  const auto ids = t.encode(text);  // the tiny vocabulary spells these characters byte by byte
  ASSERT_GT(ids.size(), text.size() - 4);
  detokenizer_stream stream(t);
  std::string out;
  for (token_id id : ids) {
    const std::string chunk = stream.push(id);
    // Every chunk is valid UTF-8 on its own.
    for (size_t i = 0; i < chunk.size();) {
      const auto b = static_cast<uint8_t>(chunk[i]);
      const size_t len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : 4;
      ASSERT_LE(i + len, chunk.size()) << "split character in chunk";
      i += len;
    }
    out += chunk;
  }
  out += stream.finish();
  EXPECT_EQ(out, text);
}

TEST(detokenizer_stream, truncated_character_at_the_end_becomes_replacement) {
  const auto t = tiny_tokenizer();
  auto ids = t.encode("x😀");
  ids.pop_back();  // drop the last byte of the emoji
  detokenizer_stream stream(t);
  std::string out;
  for (token_id id : ids) out += stream.push(id);
  EXPECT_EQ(out, "x");
  EXPECT_EQ(stream.finish(), "\xEF\xBF\xBD");
}

TEST(tokenizer, random_text_round_trips) {
  const auto t = tiny_tokenizer();
  std::mt19937 rng(5);
  const std::vector<std::string> parts = {"the", " ", "  ", "\n",         "é", "日",
                                          "😀",   "1", "'s", "<|im_end|>", "!", "\t"};
  for (int i = 0; i < 300; ++i) {
    std::string s;
    for (int k = static_cast<int>(rng() % 20); k >= 0; --k) s += parts[rng() % parts.size()];
    EXPECT_EQ(t.decode(t.encode(s, add_special::no, parse_special::yes), render_special::yes), s);
  }
}

}  // namespace
}  // namespace weft::gpu
