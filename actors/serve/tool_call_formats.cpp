// Tool-call formats besides the tagged one (tool_calls.hpp, docs/serving.md "Tool calling"):
// Llama 3.1's bare JSON calls and Mistral's [TOOL_CALLS] arrays. Both put the calls at the end of
// the answer, so the parser holds what may be calls until the answer is complete.
#include <algorithm>

#include "actors/serve/tool_calls.hpp"

namespace weft::serve {

namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr std::string_view kSpaces = " \t\r\n";

std::string_view skip_spaces(std::string_view s) {
  const size_t i = s.find_first_not_of(kSpaces);
  return i == std::string_view::npos ? std::string_view{} : s.substr(i);
}

/// Splits `s` into its top-level JSON objects, separated by ';' and whitespace (Llama 3.1 writes
/// several calls so). nullopt when anything else stands between or around them.
std::optional<std::vector<std::string_view>> split_objects(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (true) {
    while (i < s.size() && (kSpaces.find(s[i]) != std::string_view::npos || s[i] == ';')) ++i;
    if (i == s.size()) break;
    if (s[i] != '{') return std::nullopt;
    int depth = 0;
    bool in_string = false, escaped = false;
    size_t j = i;
    for (; j < s.size(); ++j) {
      const char c = s[j];
      if (in_string) {
        if (escaped) {
          escaped = false;
        } else if (c == '\\') {
          escaped = true;
        } else if (c == '"') {
          in_string = false;
        }
      } else if (c == '"') {
        in_string = true;
      } else if (c == '{') {
        ++depth;
      } else if (c == '}' && --depth == 0) {
        break;
      }
    }
    if (j == s.size()) return std::nullopt;  // cut off
    out.push_back(s.substr(i, j + 1 - i));
    i = j + 1;
  }
  if (out.empty()) return std::nullopt;
  return out;
}

}  // namespace

std::optional<tool_format> parse_tool_format(std::string_view name) {
  if (name == "hermes" || name == "tagged") return tool_format::tagged;
  if (name == "llama3_json") return tool_format::llama3_json;
  if (name == "mistral") return tool_format::mistral;
  return std::nullopt;
}

const char* tool_format_name(tool_format f) {
  switch (f) {
    case tool_format::tagged:
      return "hermes";
    case tool_format::llama3_json:
      return "llama3_json";
    case tool_format::mistral:
      return "mistral";
  }
  return "hermes";
}

tool_format tool_format_of(const gpu::chat_template& tmpl) {
  return parse_tool_format(tmpl.tool_call_style()).value_or(tool_format::tagged);
}

std::optional<std::vector<tool_call>> tool_call_parser::parse_held(std::string_view held) const {
  std::string_view s = skip_spaces(held);
  std::vector<ojson> items;
  if (tools_.format == tool_format::llama3_json) {
    if (s.starts_with(kPythonTag)) s.remove_prefix(kPythonTag.size());
    auto objects = split_objects(s);
    if (!objects) return std::nullopt;
    for (auto o : *objects) items.push_back(ojson::parse(o, nullptr, false));
  } else {
    if (s.starts_with(kMistralCalls)) s.remove_prefix(kMistralCalls.size());
    auto j = ojson::parse(s, nullptr, false);
    if (j.is_array()) {
      for (auto& e : j) items.push_back(std::move(e));
    } else {
      items.push_back(std::move(j));
    }
  }
  if (items.empty()) return std::nullopt;
  std::vector<tool_call> calls;
  for (const auto& j : items) {
    auto c = call_of(j);
    if (!c) return std::nullopt;
    calls.push_back(std::move(*c));
  }
  return calls;
}

tool_call_parser::output tool_call_parser::feed_whole(std::string_view text) {
  output out;
  buf_.append(text);
  const std::string_view marker =
      tools_.format == tool_format::llama3_json ? kPythonTag : kMistralCalls;
  if (mode_ == mode::undecided) {
    const std::string_view s = skip_spaces(buf_);
    if (s.empty()) return out;
    const bool opens = tools_.format == tool_format::llama3_json
                           ? s.front() == '{' || s.starts_with(marker)
                           : s.starts_with(marker) || s.starts_with("[{");
    // Too short to tell yet: a prefix of the marker (or Mistral's bare "[").
    const bool maybe = s.size() < marker.size() && marker.starts_with(s);
    if (opens) {
      mode_ = mode::calls;
    } else if (maybe) {
      return out;
    } else {
      mode_ = mode::content;
    }
  }
  if (mode_ == mode::calls) return out;  // held to the end
  // Content. Mistral may still open calls after some text.
  if (tools_.format == tool_format::mistral) {
    if (const size_t at = buf_.find(marker); at != std::string::npos) {
      emit_content(std::string_view(buf_).substr(0, at), out);
      buf_.erase(0, at);
      mode_ = mode::calls;
      return out;
    }
    size_t keep = 0;
    for (size_t k = std::min(buf_.size(), marker.size() - 1); k > 0; --k) {
      if (std::string_view(buf_).substr(buf_.size() - k) == marker.substr(0, k)) {
        keep = k;
        break;
      }
    }
    emit_content(std::string_view(buf_).substr(0, buf_.size() - keep), out);
    buf_.erase(0, buf_.size() - keep);
    return out;
  }
  emit_content(buf_, out);
  buf_.clear();
  return out;
}

tool_call_parser::output tool_call_parser::finish_whole() {
  output out;
  if (mode_ == mode::calls) {
    if (auto calls = parse_held(buf_)) {
      pending_ws_.clear();
      for (auto& c : *calls) {
        c.index = n_calls_;
        c.id = id_prefix_ + std::to_string(n_calls_);
        out.calls.push_back(std::move(c));
        ++n_calls_;
      }
      buf_.clear();
    }
  }
  emit_content(buf_, out);  // not calls: the text as the model wrote it
  buf_.clear();
  if (n_calls_ == 0) out.content += pending_ws_;
  pending_ws_.clear();
  mode_ = mode::undecided;
  return out;
}

}  // namespace weft::serve
