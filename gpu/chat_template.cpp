#include "gpu/chat_template.hpp"

#include <spdlog/spdlog.h>

#include "gpu/gguf.hpp"
#include "gpu/jinja.hpp"
#include "gpu/tokenizer.hpp"

namespace weft::gpu {

namespace {

bool contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

std::string_view trim(std::string_view s) {
  const auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// A ChatML template that hard-codes a system turn for conversations without one, e.g.
//   {% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are
//   ...<|im_end|>\n' }}
// Returns that literal system text (the newline may be a real one or the escape "\n").
std::optional<std::string> chatml_default_system(std::string_view src) {
  if (!contains(src, "!= 'system'") && !contains(src, "!= \"system\"")) return std::nullopt;
  constexpr std::string_view header = "<|im_start|>system";
  for (size_t at = src.find(header); at != std::string_view::npos; at = src.find(header, at + 1)) {
    std::string_view rest = src.substr(at + header.size());
    if (rest.starts_with("\n")) {
      rest.remove_prefix(1);
    } else if (rest.starts_with("\\n")) {
      rest.remove_prefix(2);
    } else {
      continue;
    }
    const size_t end = rest.find("<|im_end|>");
    if (end == std::string_view::npos) continue;
    const std::string_view text = rest.substr(0, end);
    // Only a literal: anything that looks like template code means the text is computed.
    if (text.empty() || contains(text, "{") || contains(text, "'") || contains(text, "\"") ||
        contains(text, "+")) {
      continue;
    }
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'n') {
        out += '\n';
        ++i;
      } else {
        out += text[i];
      }
    }
    return out;
  }
  return std::nullopt;
}

}  // namespace

std::string_view chat_format_name(chat_format f) {
  switch (f) {
    case chat_format::chatml:
      return "chatml";
    case chat_format::llama3:
      return "llama3";
    case chat_format::llama2:
      return "llama2";
    case chat_format::mistral:
      return "mistral";
    case chat_format::zephyr:
      return "zephyr";
  }
  return "unknown";
}

std::optional<chat_format> parse_chat_format(std::string_view name) {
  for (auto f : {chat_format::chatml, chat_format::llama3, chat_format::llama2,
                 chat_format::mistral, chat_format::zephyr}) {
    if (chat_format_name(f) == name) return f;
  }
  return std::nullopt;
}

result<chat_template> chat_template::from_name(std::string_view name) {
  if (auto f = parse_chat_format(name)) return chat_template(*f);
  return status{status_code::invalid_argument,
                "chat template: unknown format '" + std::string(name) +
                    "' (known: chatml, llama3, llama2, mistral, zephyr)"};
}

result<chat_template> chat_template::detect(std::string_view src) {
  if (contains(src, "<|im_start|>")) {
    chat_template t(chat_format::chatml);
    t.default_system_ = chatml_default_system(src);
    return t;
  }
  if (contains(src, "<|start_header_id|>") && contains(src, "<|end_header_id|>"))
    return chat_template(chat_format::llama3);
  if (contains(src, "[INST]"))
    return chat_template(contains(src, "<<SYS>>") ? chat_format::llama2 : chat_format::mistral);
  if (contains(src, "<|user|>") && contains(src, "<|assistant|>") && !contains(src, "<|end|>")) {
    chat_template t(chat_format::zephyr);
    if (contains(src, "<|endoftext|>")) t.end_of_turn_ = "<|endoftext|>";
    return t;
  }
  return status{
      status_code::unsupported,
      "chat template: the model's tokenizer.chat_template is not a format weft recognises "
      "(chatml, llama3, llama2, mistral, zephyr); choose one explicitly"};
}

result<chat_template> chat_template::from_jinja(std::string_view source, const gguf_file* file) {
  auto parsed = jinja::template_text::parse(source);
  if (!parsed) return parsed.error();
  auto t = detect(source);
  chat_template out = t ? std::move(*t) : chat_template(chat_format::chatml);
  out.jinja_ = std::make_shared<const jinja::template_text>(std::move(*parsed));
  out.renders_tools_ = source.find("tools") != std::string_view::npos;
  const auto has = [&](std::string_view s) { return source.find(s) != std::string_view::npos; };
  if (out.renders_tools_) {
    if (has("[TOOL_CALLS]")) {
      out.tool_call_style_ = "mistral";
    } else if (has("<|python_tag|>") || (has("<|start_header_id|>") && !has("<tool_call>"))) {
      out.tool_call_style_ = "llama3_json";
    }
  }
  if (file != nullptr) {
    if (auto tok = tokenizer::from_gguf(*file); tok.ok()) {
      if (auto b = tok->bos()) out.bos_text_ = std::string(tok->token_text(*b));
      if (auto e = tok->eos()) out.eos_text_ = std::string(tok->token_text(*e));
      out.drop_leading_bos_ = tok->adds_bos();
    }
  }
  // A probe conversation: a template that cannot render it is not usable.
  const std::vector<chat_message> probe{{"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}};
  if (auto r = out.apply(probe); !r)
    return status{r.error().code(), r.error().message() + " (rendering a probe conversation)"};
  return out;
}

std::string chat_template::describe() const {
  return jinja_ ? std::string("jinja") : std::string(chat_format_name(format_));
}

result<chat_template> chat_template::from_gguf(const gguf_file& file,
                                               std::optional<std::string_view> override_name) {
  if (override_name) return from_name(*override_name);
  auto src = file.get_string("tokenizer.chat_template");
  if (!src.ok()) {
    return status{
        status_code::not_found,
        "chat template: the model has no tokenizer.chat_template; choose a format explicitly"};
  }
  auto j = from_jinja(*src, &file);
  if (j) return j;
  auto t = detect(*src);
  if (!t.ok()) {
    return status{t.error().code(), t.error().message() + "; its Jinja cannot run here either: " +
                                        j.error().message()};
  }
  t->fallback_reason_ = j.error().message();
  spdlog::warn(
      "the model's chat template does not run on weft's Jinja engine ({}); rendering it as "
      "the {} format it resembles",
      t->fallback_reason_, chat_format_name(t->format_));
  if (t->format_ == chat_format::zephyr && t->end_of_turn_ == "</s>") {
    // Templates that write {{ eos_token }} end turns with the model's EOS text.
    auto tokens = file.get_string_array("tokenizer.ggml.tokens");
    auto eos = file.get_u32("tokenizer.ggml.eos_token_id");
    if (tokens.ok() && eos.ok() && *eos < tokens->size()) t->end_of_turn_ = (*tokens)[*eos];
  }
  return t;
}

result<std::string> chat_template::apply(std::span<const chat_message> messages,
                                         generation_prompt prompt,
                                         std::string_view tools_json) const {
  for (const auto& m : messages) {
    if (m.role.empty())
      return status{status_code::invalid_argument, "chat template: a message has an empty role"};
  }
  const bool add_prompt = prompt == generation_prompt::add;
  if (jinja_) {
    auto parse_json = [](std::string_view text, const char* what) -> result<jinja::value> {
      auto v = jinja::value::parse(text, nullptr, /*allow_exceptions=*/false);
      if (v.is_discarded())
        return status{status_code::invalid_argument,
                      std::string("chat template: ") + what + " is not JSON"};
      return v;
    };
    jinja::value msgs = jinja::value::array();
    for (const auto& m : messages) {
      jinja::value x{{"role", m.role}, {"content", m.content}};
      if (!m.tool_calls.empty()) {
        auto calls = parse_json(m.tool_calls, "a message's tool_calls");
        if (!calls) return calls.error();
        x["tool_calls"] = std::move(*calls);
      }
      if (!m.tool_call_id.empty()) x["tool_call_id"] = m.tool_call_id;
      msgs.push_back(std::move(x));
    }
    jinja::value ctx{{"messages", std::move(msgs)},
                     {"add_generation_prompt", add_prompt},
                     {"bos_token", bos_text_},
                     {"eos_token", eos_text_}};
    if (!tools_json.empty() && renders_tools_) {
      auto tools = parse_json(tools_json, "tools");
      if (!tools) return tools.error();
      ctx["tools"] = std::move(*tools);
    }
    auto r = jinja_->render(ctx);
    if (!r) return r.error();
    // The tokenizer adds BOS itself: a BOS the template writes first would be doubled.
    if (drop_leading_bos_ && !bos_text_.empty() && r->starts_with(bos_text_))
      r->erase(0, bos_text_.size());
    return r;
  }
  std::string out;
  switch (format_) {
    case chat_format::chatml:
      // The template inserts it inside its message loop: an empty conversation gets none.
      if (default_system_ && !messages.empty() && messages.front().role != "system") {
        out += "<|im_start|>system\n" + *default_system_ + "<|im_end|>\n";
      }
      for (const auto& m : messages)
        out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      if (add_prompt) out += "<|im_start|>assistant\n";
      break;
    case chat_format::llama3:
      // BOS is added by the tokenizer (Llama 3 files set add_bos).
      for (const auto& m : messages) {
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" +
               std::string(trim(m.content)) + "<|eot_id|>";
      }
      if (add_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case chat_format::llama2:
    case chat_format::mistral: {
      // The first <s> comes from the tokenizer (BOS). System messages go into the first user turn:
      // a <<SYS>> block for Llama 2, plain text for Mistral (which has no system role).
      // Llama 2:  [INST] <<SYS>>\nsys\n<</SYS>>\n\nuser [/INST] answer </s><s>[INST] next [/INST]
      // Mistral:  [INST] sys\n\nuser [/INST]answer</s>[INST] next [/INST]
      const bool llama2 = format_ == chat_format::llama2;
      std::string system;
      bool first_user = true;
      for (const auto& m : messages) {
        const std::string content(trim(m.content));
        if (m.role == "system") {
          system += system.empty() ? content : "\n" + content;
        } else if (m.role == "user") {
          if (!first_user && llama2) out += "<s>";
          out += "[INST] ";
          if (first_user && !system.empty())
            out += llama2 ? "<<SYS>>\n" + system + "\n<</SYS>>\n\n" : system + "\n\n";
          out += content + " [/INST]";
          first_user = false;
        } else {
          out += llama2 ? " " + content + " </s>" : content + "</s>";
        }
      }
      // After " [/INST]" the model answers directly: there is no assistant header to add.
      break;
    }
    case chat_format::zephyr:
      for (const auto& m : messages)
        out += "<|" + m.role + "|>\n" + m.content + end_of_turn_ + "\n";
      if (add_prompt) out += "<|assistant|>\n";
      break;
  }
  return out;
}

}  // namespace weft::gpu
