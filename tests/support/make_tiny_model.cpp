// Writes a tiny generated Llama-family GGUF (gpu/tiny_model.hpp) for tests that drive the `weft`
// binary (and for benchmarks: any Llama shape with random weights):
//   make_tiny_model PATH [--layers N] [--embd N] [--heads N] [--kv-heads N] [--ff N] [--vocab N]
//                   [--context N] [--experts N --experts-used K] [--type f32|f16|q8_0|q4_0|q4_1]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "gpu/tiny_model.hpp"

int main(int argc, char** argv) {
  const bool help = argc >= 2 && argv[1][0] == '-';  // --help, or a flag where PATH goes
  if (argc < 2 || help) {
    std::fprintf(help ? stdout : stderr,
                 "usage: %s PATH [--layers N] [--embd N] [--heads N] [--kv-heads N] [--ff N]\n"
                 "       [--vocab N] [--context N] [--experts N --experts-used K] [--type T]\n",
                 argv[0]);
    return help && std::string_view{argv[1]} == "--help" ? 0 : 2;
  }
  weft::gpu::tiny_model_config c;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--layers") {
      c.n_layers = static_cast<uint32_t>(std::atoi(argv[i + 1]));
    } else if (k == "--embd") {
      c.n_embd = static_cast<uint32_t>(std::atoi(argv[i + 1]));
    } else if (k == "--heads") {
      c.n_head = static_cast<uint32_t>(std::atoi(argv[i + 1]));
    } else if (k == "--kv-heads") {
      c.n_head_kv = static_cast<uint32_t>(std::atoi(argv[i + 1]));
    } else if (k == "--ff") {
      c.n_ff = static_cast<uint32_t>(std::atoi(argv[i + 1]));
    } else if (k == "--vocab") {
      c.n_vocab = static_cast<uint32_t>(std::atoi(argv[i + 1]));
    } else if (k == "--context") {
      c.context_length = static_cast<uint32_t>(std::atoi(argv[i + 1]));
    } else if (k == "--experts") {
      c.n_expert = static_cast<uint32_t>(std::atoi(argv[i + 1]));
    } else if (k == "--experts-used") {
      c.n_expert_used = static_cast<uint32_t>(std::atoi(argv[i + 1]));
    } else if (k == "--type") {
      auto t = weft::gpu::parse_type_name(argv[i + 1]);
      if (!t) {
        std::fprintf(stderr, "unknown type %s\n", argv[i + 1]);
        return 2;
      }
      c.weight_type = *t;
    } else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (auto st = weft::gpu::write_tiny_model(c, argv[1]); !st) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
}
