// Fuzz entry point for the GGUF reader and everything that reads a parsed file (tokenizer, chat
// template). Built as a libFuzzer target with WEFT_FUZZ=ON, otherwise driven by fuzz_driver.cpp.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "gpu/chat_template.hpp"
#include "gpu/gguf.hpp"
#include "gpu/tokenizer.hpp"

namespace {

volatile uint8_t sink;

void exercise(const weft::gpu::gguf_file& f, std::string_view text) {
  using namespace weft::gpu;
  for (const auto& t : f.tensors()) {
    // Accepted tensors lie inside the image: touching their first and last bytes must be safe.
    if (t.size_bytes > 0)
      sink = static_cast<uint8_t>(t.data[0]) ^ static_cast<uint8_t>(t.data[t.size_bytes - 1]);
  }
  for (const auto& [key, value] : f.metadata())
    sink = static_cast<uint8_t>(key.size() + value.v.index());
  auto tok = tokenizer::from_gguf(f);
  if (tok.ok()) {
    const auto ids = tok->encode(text, add_special::yes, parse_special::yes);
    sink = static_cast<uint8_t>(tok->decode(ids, render_special::yes).size());
  }
  auto tmpl = chat_template::from_gguf(f);
  if (tmpl.ok()) {
    const chat_message m{"user", std::string(text.substr(0, 64))};
    sink = static_cast<uint8_t>(tmpl->apply(std::span(&m, 1)).ok());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weft::gpu;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (auto policy : {tensor_type_policy::supported_only, tensor_type_policy::any_known}) {
    auto f = gguf_file::parse(bytes, gguf_open_config{.type_policy = policy});
    if (f.ok()) exercise(*f, text.substr(0, 256));
  }
  (void)chat_template::detect(text);
  return 0;
}
