// Writes the seed corpus of gpu_gguf_fuzz (tests/fuzz/gpu/seeds): small valid GGUF files of the
// kinds the reader must handle (dense and MoE tiny models with a tokenizer and chat template,
// nested/bool arrays with 64-byte alignment, an empty file). Rerun after format changes:
//
//   gpu_gguf_fuzz_seeds tests/fuzz/gpu/seeds
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gpu/gguf_writer.hpp"
#include "gpu/tiny_model.hpp"

int main(int argc, char** argv) {
  using namespace weft::gpu;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  std::vector<std::pair<std::string, std::vector<std::byte>>> seeds;
  tiny_model_config small;
  small.n_layers = 1;
  small.n_embd = 32;
  small.n_head = 2;
  small.n_head_kv = 1;
  small.n_ff = 32;
  small.n_vocab = 262;
  small.weight_type = ggml_type::q4_0;
  small.embedding_type = ggml_type::q8_0;
  seeds.emplace_back("tiny_dense.gguf", make_tiny_model(small).value());
  small.weight_type = ggml_type::q4_1;
  small.n_expert = 2;
  small.n_expert_used = 1;
  small.output = output_weight::separate;
  seeds.emplace_back("tiny_moe.gguf", make_tiny_model(small).value());
  gguf_writer w(gguf_writer_config{64});
  w.set("a", make_array(std::vector<gguf_value>{make_array(std::vector<std::string>{"x", "y"})}));
  w.set("b", make_array(std::vector<bool>{true, false}));
  w.set("c", 1.5);
  w.set("d", int64_t{-7});
  if (!w.add_tensor_from_f32("t", ggml_type::q8_0, std::vector<int64_t>{32, 2},
                             std::vector<float>(64, 0.25f))
           .ok() ||
      !w.add_tensor_from_f32("h", ggml_type::bf16, std::vector<int64_t>{3},
                             std::vector<float>{1, 2, 3})
           .ok()) {
    return 1;
  }
  seeds.emplace_back("arrays_aligned64.gguf", w.to_bytes().value());
  seeds.emplace_back("empty.gguf", gguf_writer().to_bytes().value());
  for (const auto& [name, bytes] : seeds) {
    const std::string path = std::string(argv[1]) + "/" + name;
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
    std::printf("%s: %zu bytes\n", path.c_str(), bytes.size());
  }
  return 0;
}
