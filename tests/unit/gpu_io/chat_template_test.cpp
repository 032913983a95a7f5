#include <gtest/gtest.h>

#include "gguf_test_util.hpp"
#include "gpu/chat_template.hpp"
#include "gpu/gguf.hpp"
#include "gpu/tiny_model.hpp"

namespace weft::gpu {
namespace {

const std::vector<chat_message> conversation = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "2+2?"}};

TEST(chat_template, chatml_with_default_system_prompt_from_the_template) {
  auto t = chat_template::detect(tiny_chat_template());
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->format(), chat_format::chatml);
  ASSERT_TRUE(t->default_system_prompt().has_value());
  EXPECT_EQ(*t->default_system_prompt(),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  const std::vector<chat_message> user_only = {{"user", "Hi"}};
  EXPECT_EQ(t->apply(user_only).value(),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  // As in the template, an empty conversation gets no system turn.
  EXPECT_EQ(t->apply(std::vector<chat_message>{}).value(), "<|im_start|>assistant\n");
  EXPECT_EQ(t->apply(conversation, generation_prompt::omit).value(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n");
}

TEST(chat_template, plain_chatml_has_no_default_system) {
  auto t = chat_template::detect(
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + "
      "'<|im_end|>' + '\\n'}}{% endfor %}");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->default_system_prompt().has_value());
  const std::vector<chat_message> user_only = {{"user", "Hi"}};
  EXPECT_EQ(t->apply(user_only).value(), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(chat_template, llama3) {
  auto t = chat_template::detect(
      "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->format(), chat_format::llama3);
  EXPECT_EQ(t->apply(std::vector<chat_message>{{"system", " sys "}, {"user", "Hi"}}).value(),
            "<|start_header_id|>system<|end_header_id|>\n\nsys<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(chat_template, llama2_and_mistral) {
  auto l2 = chat_template::detect("{{ bos_token + '[INST] ' + '<<SYS>>\\n' }}");
  ASSERT_TRUE(l2.ok());
  EXPECT_EQ(l2->format(), chat_format::llama2);
  EXPECT_EQ(l2->apply(conversation).value(),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] 2+2? [/INST]");
  auto mi = chat_template::detect("{{ '[INST] ' + message['content'] + ' [/INST]' }}");
  ASSERT_TRUE(mi.ok());
  EXPECT_EQ(mi->format(), chat_format::mistral);
  EXPECT_EQ(mi->apply(conversation).value(),
            "[INST] Be brief.\n\nHi [/INST]Hello!</s>[INST] 2+2? [/INST]");
}

TEST(chat_template, zephyr) {
  auto t = chat_template::detect(
      "{{ '<|user|>\n' + message['content'] + eos_token }}{{ '<|assistant|>' }}");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->format(), chat_format::zephyr);
  EXPECT_EQ(t->apply(std::vector<chat_message>{{"system", "S"}, {"user", "Hi"}}).value(),
            "<|system|>\nS</s>\n<|user|>\nHi</s>\n<|assistant|>\n");
}

TEST(chat_template, unknown_template_and_override) {
  auto t = chat_template::detect("{{ 'User: ' + message['content'] }}");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code(), status_code::unsupported);
  EXPECT_TRUE(chat_template::from_name("zephyr").ok());
  EXPECT_FALSE(chat_template::from_name("nope").ok());
  const auto f = gguf_file::parse(make_tiny_model({}).value()).value();
  EXPECT_EQ(chat_template::from_gguf(f).value().format(), chat_format::chatml);
  EXPECT_EQ(chat_template::from_gguf(f, "llama3").value().format(), chat_format::llama3);
  EXPECT_FALSE(chat_template(chat_format::chatml).apply(std::vector<chat_message>{{"", "x"}}).ok());
}

}  // namespace
}  // namespace weft::gpu
