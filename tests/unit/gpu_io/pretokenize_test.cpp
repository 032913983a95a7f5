// Word splitting of each pre-tokenizer, checked against the regexes they implement (expected
// splits written by hand from the regex semantics).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu/internal/tokenizer_pretokenize.hpp"
#include "gpu/internal/tokenizer_unicode.hpp"

namespace weft::gpu::internal {
namespace {

enum class rules { gpt2, smollm, llama3, qwen2 };

std::vector<std::string> split(rules r, const std::string& text) {
  const auto cpts = decode_utf8_lenient(text);
  const fragments all{cpts.size()};
  fragments f;
  switch (r) {
    case rules::gpt2:
      f = split_gpt2(cpts, all);
      break;
    case rules::smollm:
      f = split_gpt2(cpts, split_each_number(cpts, all));
      break;
    case rules::llama3:
      f = split_llama3(cpts, all, 3);
      break;
    case rules::qwen2:
      f = split_llama3(cpts, all, 1);
      break;
  }
  std::vector<std::string> out;
  size_t begin = 0;
  for (size_t len : f) {
    std::string s;
    for (size_t i = begin; i < begin + len; ++i) append_utf8(s, cpts[i]);
    out.push_back(s);
    begin += len;
  }
  return out;
}

using words = std::vector<std::string>;

TEST(pretokenize, gpt2) {
  EXPECT_EQ(split(rules::gpt2, "Hello world"), (words{"Hello", " world"}));
  EXPECT_EQ(split(rules::gpt2, "it's 2024!!  ok"), (words{"it", "'s", " 2024", "!!", " ", " ok"}));
  EXPECT_EQ(split(rules::gpt2, "a   \n"),
            (words{"a", "   \n"}));  // trailing whitespace run stays whole
  EXPECT_EQ(split(rules::gpt2, "(x)"), (words{"(", "x", ")"}));
  EXPECT_EQ(split(rules::gpt2, "IT'S"),
            (words{"IT", "'", "S"}));  // contractions are case-sensitive
  EXPECT_EQ(split(rules::gpt2, "日本語 テスト"), (words{"日本語", " テスト"}));
  EXPECT_EQ(split(rules::gpt2, "a\u00a0b"), (words{"a", "\u00a0", "b"}));  // NBSP is \s
}

TEST(pretokenize, smollm_isolates_digits) {
  EXPECT_EQ(split(rules::smollm, "x 123"), (words{"x", " ", "1", "2", "3"}));
  EXPECT_EQ(split(rules::smollm, "v2.0"), (words{"v", "2", ".", "0"}));
  EXPECT_EQ(split(rules::smollm, "½٣"),
            (words{"½", "٣"}));  // \p{N} includes No and Nd of any script
}

TEST(pretokenize, llama3_and_qwen2) {
  EXPECT_EQ(split(rules::llama3, "x 1234567"), (words{"x", " ", "123", "456", "7"}));
  EXPECT_EQ(split(rules::qwen2, "x 123"), (words{"x", " ", "1", "2", "3"}));
  EXPECT_EQ(split(rules::llama3, "IT'S"), (words{"IT", "'S"}));  // case-insensitive contractions
  EXPECT_EQ(split(rules::llama3, "(hello"), (words{"(hello"}));  // one non-letter prefix
  EXPECT_EQ(split(rules::llama3, "a  \n\n  b"), (words{"a", "  \n\n", " ", " b"}));
  EXPECT_EQ(split(rules::llama3, "ok!!\n\nnext"), (words{"ok", "!!\n\n", "next"}));
}

TEST(pretokenize, classes) {
  EXPECT_EQ(classify('a'), cpt_class::letter);
  EXPECT_EQ(classify(0x65E5), cpt_class::letter);  // 日
  EXPECT_EQ(classify(0x0663), cpt_class::number);  // Arabic-Indic 3
  EXPECT_EQ(classify(0x3000), cpt_class::whitespace);
  EXPECT_EQ(classify(0x1F600), cpt_class::other);  // emoji
  EXPECT_EQ(classify(0x0301), cpt_class::other);   // combining accent (\p{M})
  EXPECT_EQ(classify(0x110000), cpt_class::other);
}

TEST(pretokenize, lenient_utf8_and_byte_map) {
  EXPECT_EQ(decode_utf8_lenient("\xE2\x82"), (std::vector<uint32_t>{0xFFFD, 0xFFFD}));
  EXPECT_EQ(decode_utf8_lenient("\xF0\x9F\x98\x80"), (std::vector<uint32_t>{0x1F600}));
  EXPECT_EQ(incomplete_utf8_tail("ab\xF0\x9F"), 2u);
  EXPECT_EQ(incomplete_utf8_tail("ab\xF0\x9F\x98\x80"), 0u);
  EXPECT_EQ(byte_to_cpt(' '), 0x120u);  // 'Ġ'
  EXPECT_EQ(byte_to_cpt('A'), static_cast<uint32_t>('A'));
  for (int b = 0; b < 256; ++b) EXPECT_EQ(cpt_to_byte(byte_to_cpt(static_cast<uint8_t>(b))), b);
}

}  // namespace
}  // namespace weft::gpu::internal
