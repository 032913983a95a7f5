// The engine's streamed text: what each output's text delta holds back while a request runs (an
// incomplete UTF-8 character, the start of a stop string), and where a request that continues
// tokens generated elsewhere starts its text.
#include "gpu/engine.hpp"

#include <algorithm>
#include <string>
#include <vector>

namespace weft::gpu {

namespace {

// Bytes at the end of `s` that start an incomplete UTF-8 sequence (held back from a text delta).
size_t incomplete_utf8_tail(const std::string& s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte
    size_t need = 1;
    if ((c & 0xE0) == 0xC0)
      need = 2;
    else if ((c & 0xF0) == 0xE0)
      need = 3;
    else if ((c & 0xF8) == 0xF0)
      need = 4;
    return need > back ? back : 0;
  }
  return 0;
}

/// Bytes at the end of a request's text that a text delta holds back while it runs: an
/// incomplete UTF-8 character, or the start of a stop string.
size_t text_hold(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = incomplete_utf8_tail(text);
  for (const auto& s : stops) {
    if (s.empty()) continue;
    for (size_t k = std::min(s.size() - 1, text.size()); k > hold; --k) {
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  return hold;
}

}  // namespace

void engine::resume_text(request& r, int64_t n_generated) {
  if (!config_.detokenize || n_generated <= 0) return;
  for (size_t i = r.tokens.size() - static_cast<size_t>(n_generated); i < r.tokens.size(); ++i) {
    r.text += config_.detokenize(r.tokens[i]);
  }
  // What the engine it came from held back is not emitted yet: the next delta starts with it.
  r.text_emitted = r.text.size() - text_hold(r.text, r.smp.params().stop_strings);
}

void engine::finish_text(request& r, request_output& out, bool final) {
  size_t emit_to = r.text.size();
  if (!final) emit_to = r.text.size() - text_hold(r.text, r.smp.params().stop_strings);
  if (emit_to > r.text_emitted) {
    out.text_delta += r.text.substr(r.text_emitted, emit_to - r.text_emitted);
    r.text_emitted = emit_to;
  }
}

}  // namespace weft::gpu
