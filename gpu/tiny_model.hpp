#pragma once
/// Generator of tiny Llama-family GGUF models with random weights, for tests that need a complete
/// model file without a download: llama.cpp tensor names and metadata keys, dense or MoE
/// feed-forward, a small byte-level BPE vocabulary trained on a built-in English text, and a ChatML
/// template.
///
/// Deterministic: the same config gives the same bytes on every platform (own PRNG, no std
/// distributions).

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "gpu/ggml_types.hpp"
#include "gpu/status.hpp"
#include "gpu/tokenizer.hpp"

namespace weft::gpu {

/// Whether the LM head reuses the token embedding (no output.weight tensor) or has its own.
enum class output_weight { tied, separate };

/// Shape and content of a tiny model. Quantized weight types need n_embd and n_ff to be multiples
/// of 32.
struct tiny_model_config {
  uint32_t n_layers = 2;
  uint32_t n_embd = 64;
  uint32_t n_head = 4;
  uint32_t n_head_kv = 2;
  uint32_t n_ff = 128;
  /// Vocabulary size: 3 control tokens + 256 byte tokens + learned merges (padded with unused
  /// tokens if the built-in text runs out of merges). At least 259.
  uint32_t n_vocab = 384;
  uint32_t context_length = 256;
  float rope_freq_base = 10000.0f;
  float rms_norm_eps = 1e-5f;
  output_weight output = output_weight::tied;
  /// Type of the 2-D weight matrices (f32, f16, bf16, q8_0, q4_0, q4_1).
  ggml_type weight_type = ggml_type::f32;
  /// Type of token_embd.weight; defaults to weight_type.
  std::optional<ggml_type> embedding_type;
  /// Mixture of experts: 0 = dense FFN; otherwise blk.N.ffn_gate_inp / ffn_{gate,up,down}_exps.
  uint32_t n_expert = 0;
  uint32_t n_expert_used = 0;
  uint64_t seed = 42;
  std::string name = "weft-tiny";
};

/// The GGUF image of a tiny model.
result<std::vector<std::byte>> make_tiny_model(const tiny_model_config& config);

/// Writes make_tiny_model(config) to `path`.
status write_tiny_model(const tiny_model_config& config, const std::filesystem::path& path);

/// The tokenizer vocabulary tiny models carry (tokenizer.ggml.pre = "smollm", ids 0..2 =
/// <|endoftext|>, <|im_start|>, <|im_end|>; bos = 1, eos = 2, no automatic BOS).
result<tokenizer::vocabulary> tiny_vocabulary(uint32_t n_vocab);

/// The ChatML template (with SmolLM2's default system prompt) stored in tiny models.
std::string_view tiny_chat_template();

}  // namespace weft::gpu
