#include <gtest/gtest.h>

#include "gpu/gguf.hpp"
#include "gpu/tiny_model.hpp"
#include "gpu/tokenizer.hpp"

namespace weft::gpu {
namespace {

gguf_file open_tiny(const tiny_model_config& c) {
  auto bytes = make_tiny_model(c);
  EXPECT_TRUE(bytes.ok()) << (bytes.ok() ? "" : bytes.error().message());
  auto f = gguf_file::parse(bytes.value());
  EXPECT_TRUE(f.ok()) << (f.ok() ? "" : f.error().message());
  return std::move(f).value();
}

TEST(tiny_model, dense_llama_layout_and_metadata) {
  tiny_model_config c;
  c.n_layers = 3;
  const auto f = open_tiny(c);
  EXPECT_EQ(f.architecture(), "llama");
  EXPECT_EQ(f.get_u32("llama.block_count").value(), 3u);
  EXPECT_EQ(f.get_u32("llama.embedding_length").value(), 64u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count_kv").value(), 2u);
  EXPECT_EQ(f.get_u32("llama.rope.dimension_count").value(), 16u);
  EXPECT_EQ(f.get_f32("llama.rope.freq_base").value(), 10000.0f);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens").value().size(), 384u);
  EXPECT_EQ(f.tensors().size(), 1u + 3u * 9u + 1u);  // embd, 9 per layer, output_norm (tied)
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);
  const auto* k = f.find_tensor("blk.2.attn_k.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->ne[0], 64);
  EXPECT_EQ(k->ne[1], 32);  // n_head_kv * head_dim
  const auto* down = f.find_tensor("blk.0.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->ne[0], 128);
  EXPECT_EQ(down->ne[1], 64);
  const auto* norm = f.find_tensor("blk.1.attn_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->type, ggml_type::f32);
  const float* w = reinterpret_cast<const float*>(norm->data);
  for (int i = 0; i < 64; ++i) {
    EXPECT_GT(w[i], 0.85f);
    EXPECT_LT(w[i], 1.15f);
  }
}

TEST(tiny_model, moe_uses_llama_cpp_expert_tensor_names) {
  tiny_model_config c;
  c.n_expert = 4;
  c.n_expert_used = 2;
  c.weight_type = ggml_type::q8_0;
  c.output = output_weight::separate;
  const auto f = open_tiny(c);
  EXPECT_EQ(f.get_u32("llama.expert_count").value(), 4u);
  EXPECT_EQ(f.get_u32("llama.expert_used_count").value(), 2u);
  const auto* gate = f.find_tensor("blk.1.ffn_gate_exps.weight");
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(gate->type, ggml_type::q8_0);
  EXPECT_EQ(gate->n_dims, 3u);
  EXPECT_EQ(gate->ne[0], 64);
  EXPECT_EQ(gate->ne[1], 128);
  EXPECT_EQ(gate->ne[2], 4);
  const auto* down = f.find_tensor("blk.1.ffn_down_exps.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->ne[0], 128);
  EXPECT_EQ(down->ne[1], 64);
  const auto* router = f.find_tensor("blk.0.ffn_gate_inp.weight");
  ASSERT_NE(router, nullptr);
  EXPECT_EQ(router->ne[1], 4);
  EXPECT_NE(f.find_tensor("blk.0.ffn_up_exps.weight"), nullptr);
  EXPECT_EQ(f.find_tensor("blk.0.ffn_up.weight"), nullptr);
  EXPECT_NE(f.find_tensor("output.weight"), nullptr);
}

TEST(tiny_model, every_weight_type_and_mixed_embedding_type) {
  for (ggml_type t : {ggml_type::f32, ggml_type::f16, ggml_type::bf16, ggml_type::q8_0,
                      ggml_type::q4_0, ggml_type::q4_1}) {
    tiny_model_config c;
    c.weight_type = t;
    c.embedding_type = ggml_type::q8_0;
    const auto f = open_tiny(c);
    EXPECT_EQ(f.find_tensor("blk.0.attn_q.weight")->type, t);
    EXPECT_EQ(f.find_tensor("token_embd.weight")->type, ggml_type::q8_0);
  }
}

TEST(tiny_model, deterministic_and_seed_dependent) {
  tiny_model_config c;
  const auto a = make_tiny_model(c).value();
  const auto b = make_tiny_model(c).value();
  EXPECT_EQ(a, b);
  c.seed = 7;
  EXPECT_NE(make_tiny_model(c).value(), a);
}

TEST(tiny_model, rejects_inconsistent_configs) {
  const auto bad = [](auto mutate) {
    tiny_model_config c;
    mutate(c);
    return !make_tiny_model(c).ok();
  };
  EXPECT_TRUE(bad([](tiny_model_config& c) { c.n_head = 5; }));
  EXPECT_TRUE(bad([](tiny_model_config& c) { c.n_head_kv = 3; }));
  EXPECT_TRUE(bad([](tiny_model_config& c) { c.n_vocab = 100; }));
  EXPECT_TRUE(bad([](tiny_model_config& c) { c.n_expert = 2; }));
  EXPECT_TRUE(bad([](tiny_model_config& c) { c.n_expert = 2, c.n_expert_used = 3; }));
  EXPECT_TRUE(bad([](tiny_model_config& c) { c.weight_type = ggml_type::q4_k; }));
  EXPECT_TRUE(bad([](tiny_model_config& c) { c.weight_type = ggml_type::q4_1, c.n_ff = 48; }));
}

TEST(tiny_model, vocabulary_learns_merges_and_pads) {
  auto v = tiny_vocabulary(300);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->tokens.size(), 300u);
  EXPECT_EQ(v->merges.size(), 300u - 259u);
  EXPECT_EQ(v->merges[0], "Ġ t");    // " t" is the most frequent pair of the built-in text
  auto big = tiny_vocabulary(4000);  // more than the text can teach: padded with unused tokens
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->tokens.size(), 4000u);
  EXPECT_EQ(big->types.back(), token_type::unused);
}

}  // namespace
}  // namespace weft::gpu
