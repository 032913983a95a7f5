// Debug tool for the oracle: runs one teacher-forced batch and writes every position's logits
// (float32, [n_tokens][n_vocab]) to a file. Usage: gpu_logits_dump MODEL OUT.bin TOKEN...
// With WEFT_DUMP_DECODE=k the last k tokens are decode steps of one token each.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/gguf.hpp"
#include "gpu/kv_cache.hpp"
#include "gpu/model.hpp"

int main(int argc, char** argv) {
  using namespace weft::gpu;
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s MODEL OUT.bin TOKEN...\n", argv[0]);
    return 2;
  }
  auto dev = device_registry::instance().create("cpu", device_config{2, 0});
  auto f = gguf_file::open(argv[1]);
  if (!f) {
    std::fprintf(stderr, "%s\n", f.error().to_string().c_str());
    return 1;
  }
  auto m = model::load(std::move(f.value()), *dev.value());
  if (!m) {
    std::fprintf(stderr, "%s\n", m.error().to_string().c_str());
    return 1;
  }
  kv_cache_config kc;
  kc.layout = m.value()->kv_layout_for(16);
  kc.n_blocks = 128;
  auto kv = kv_cache::create(*dev.value(), kc);
  // WEFT_DUMP_DECODE=k: the last k tokens go through one decode step each (GEMV numerics).
  const char* dec = std::getenv("WEFT_DUMP_DECODE");
  const int n = argc - 3;
  const int n_decode = dec != nullptr ? std::min(std::atoi(dec), n - 1) : 0;
  const seq_id s = kv.value()->create_sequence();
  std::vector<float> logits;
  for (int first = 0; first < n;) {
    const int count = first == 0 ? n - n_decode : 1;
    forward_batch b;
    b.seqs.push_back(s);
    for (int i = first; i < first + count; ++i) {
      b.tokens.push_back(std::atoi(argv[3 + i]));
      b.seq_index.push_back(0);
      b.want_logits.push_back(1);
    }
    forward_output out;
    if (auto st = m.value()->forward(b, *kv.value(), out); !st) {
      std::fprintf(stderr, "%s\n", st.to_string().c_str());
      return 1;
    }
    logits.insert(logits.end(), out.logits.begin(), out.logits.end());
    first += count;
  }
  FILE* o = std::fopen(argv[2], "wb");
  std::fwrite(logits.data(), sizeof(float), logits.size(), o);
  std::fclose(o);
  return 0;
}
