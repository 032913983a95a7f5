// Replays a libFuzzer target without libFuzzer (gcc builds): every file in the directories given on
// the command line, then --mutations N deterministic mutations of them (byte flips, truncation,
// insertion, splicing). A crash or sanitizer report fails the test like libFuzzer would.

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  size_t mutations = 10000;
  std::vector<std::vector<uint8_t>> seeds;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--mutations") == 0 && i + 1 < argc) {
      mutations = std::strtoull(argv[++i], nullptr, 10);
      continue;
    }
    std::filesystem::path dir(argv[i]);
    if (!std::filesystem::is_directory(dir)) continue;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      std::ifstream in(entry.path(), std::ios::binary);
      seeds.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
  }
  if (seeds.empty()) seeds.push_back({});
  for (const auto& s : seeds) LLVMFuzzerTestOneInput(s.data(), s.size());
  std::mt19937_64 rng(0x5eed);
  for (size_t m = 0; m < mutations; ++m) {
    auto input = seeds[rng() % seeds.size()];
    int ops = 1 + static_cast<int>(rng() % 4);
    for (int o = 0; o < ops; ++o) {
      switch (rng() % 4) {
        case 0:
          if (!input.empty()) input[rng() % input.size()] = static_cast<uint8_t>(rng());
          break;
        case 1:
          if (!input.empty()) input.resize(rng() % input.size());
          break;
        case 2:
          input.insert(input.begin() + static_cast<long>(input.empty() ? 0 : rng() % input.size()),
                       static_cast<uint8_t>(rng()));
          break;
        case 3: {
          const auto& other = seeds[rng() % seeds.size()];
          if (!other.empty()) {
            size_t from = rng() % other.size();
            input.insert(input.end(), other.begin() + static_cast<long>(from), other.end());
          }
          break;
        }
      }
    }
    LLVMFuzzerTestOneInput(input.data(), input.size());
  }
  std::printf("fuzz driver: %zu seeds, %zu mutations, no crash\n", seeds.size(), mutations);
  return 0;
}
