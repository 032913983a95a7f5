// Fuzz entry point for the Jinja engine of chat templates (gpu/jinja.hpp): any bytes as a
// template, parsed and rendered over a small conversation, must give a result or an error —
// never a crash, a hang or unbounded memory (model files carry their templates).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "gpu/jinja.hpp"

namespace {
volatile size_t sink;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weft::gpu::jinja;
  static const value ctx = value::parse(R"({"messages": [
      {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <b>\n"},
      {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f",
       "arguments": {"x": [1, 2.5, null, true]}}}]}, {"role": "tool", "content": "42"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})");
  auto t = template_text::parse(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!t) return 0;
  auto r = t->render(ctx);
  sink = r.ok() ? r->size() : r.error().message().size();
  return 0;
}
