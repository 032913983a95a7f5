#include "actors/serve/tool_calls.hpp"

#include <algorithm>
#include <set>

#include "gpu/grammar.hpp"

namespace weft::serve {

namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
}

std::string kind_of(const ojson& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "a list";
  return "an object";
}

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::optional<tool_error> read_tool(const ojson& t, const std::string& at, tool_function& f,
                                    bool& strict) {
  if (!t.is_object()) return tool_error{at, "'" + at + "' must be an object, got " + kind_of(t)};
  auto type = t.find("type");
  if (type != t.end() && (!type->is_string() || type->get<std::string>() != "function"))
    return tool_error{at + ".type", "'" + at + ".type' must be 'function'"};
  auto fn = t.find("function");
  if (fn == t.end() || !fn->is_object())
    return tool_error{at + ".function", "'" + at + ".function' is required and must be an object"};
  auto name = fn->find("name");
  if (name == fn->end() || !name->is_string() || !valid_name(name->get<std::string>()))
    return tool_error{at + ".function.name", "'" + at +
                                                 ".function.name' is required: 1 to 64 letters, "
                                                 "digits, '_' or '-'"};
  f.name = name->get<std::string>();
  if (auto d = fn->find("description"); d != fn->end() && !d->is_null()) {
    if (!d->is_string())
      return tool_error{at + ".function.description",
                        "'" + at + ".function.description' must be a string"};
    f.description = d->get<std::string>();
  }
  f.parameters = ojson{{"type", "object"}};
  if (auto p = fn->find("parameters"); p != fn->end() && !p->is_null()) {
    if (!p->is_object())
      return tool_error{at + ".function.parameters",
                        "'" + at + ".function.parameters' must be a JSON Schema object"};
    if (!p->empty()) f.parameters = *p;
  }
  if (auto s = fn->find("strict"); s != fn->end() && !s->is_null()) {
    if (!s->is_boolean())
      return tool_error{at + ".function.strict", "'" + at + ".function.strict' must be a boolean"};
    strict = strict || s->get<bool>();
  }
  return std::nullopt;
}

}  // namespace

const tool_function* tool_config::find(std::string_view name) const {
  for (const auto& t : tools) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::optional<tool_error> read_tool_config(const ojson& body, tool_config& out) {
  const tool_format format = out.format;
  out = {};
  out.format = format;
  bool strict = false;
  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    if (!t->is_array()) return tool_error{"tools", "'tools' must be a list, got " + kind_of(*t)};
    if (t->size() > 128) return tool_error{"tools", "at most 128 tools"};
    std::set<std::string> seen;
    for (size_t i = 0; i < t->size(); ++i) {
      tool_function f;
      const std::string at = "tools[" + std::to_string(i) + "]";
      if (auto e = read_tool((*t)[i], at, f, strict)) return e;
      if (!seen.insert(f.name).second)
        return tool_error{at + ".function.name", "function '" + f.name + "' is listed twice"};
      out.tools.push_back(std::move(f));
    }
  }
  out.choice = out.tools.empty() ? tool_choice::none : tool_choice::automatic;
  if (auto c = body.find("tool_choice"); c != body.end() && !c->is_null()) {
    if (c->is_string()) {
      const std::string s = c->get<std::string>();
      if (s == "none") {
        out.choice = tool_choice::none;
      } else if (s == "auto") {
        out.choice = out.tools.empty() ? tool_choice::none : tool_choice::automatic;
      } else if (s == "required") {
        out.choice = tool_choice::required;
      } else {
        return tool_error{"tool_choice",
                          "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": "
                          "\"function\", \"function\": {\"name\": ...}}, got '" +
                              s + "'"};
      }
    } else if (c->is_object()) {
      auto fn = c->find("function");
      const ojson* name = nullptr;
      if (fn != c->end() && fn->is_object()) {
        if (auto it = fn->find("name"); it != fn->end()) name = &*it;
      }
      if (name == nullptr || !name->is_string())
        return tool_error{"tool_choice",
                          "'tool_choice' as an object must be {\"type\": \"function\", "
                          "\"function\": {\"name\": ...}}"};
      out.choice = tool_choice::named;
      out.named = name->get<std::string>();
    } else {
      return tool_error{"tool_choice",
                        "'tool_choice' must be a string or an object, got " + kind_of(*c)};
    }
  }
  if ((out.choice == tool_choice::required || out.choice == tool_choice::named) &&
      out.tools.empty())
    return tool_error{"tool_choice", "'tool_choice' requires a call but 'tools' is empty"};
  if (out.choice == tool_choice::named && out.find(out.named) == nullptr)
    return tool_error{"tool_choice",
                      "'tool_choice' names function '" + out.named + "', which is not in 'tools'"};
  if (auto p = body.find("parallel_tool_calls"); p != body.end() && !p->is_null()) {
    if (!p->is_boolean())
      return tool_error{"parallel_tool_calls", "'parallel_tool_calls' must be a boolean"};
    out.parallel = p->get<bool>();
  }
  if (strict && out.choice == tool_choice::automatic)
    return tool_error{"tools",
                      "'strict' function schemas are enforced only when a call is required: use "
                      "tool_choice 'required' or a named function (with 'auto' the model may "
                      "answer in text, and its arguments are not constrained)"};
  return std::nullopt;
}

std::optional<tool_error> read_message_tool_calls(const ojson& calls, const std::string& at,
                                                  std::string& calls_json) {
  ojson out = ojson::array();
  const std::string p = at + ".tool_calls";
  if (!calls.is_array()) return tool_error{p, "'" + p + "' must be a list"};
  for (size_t i = 0; i < calls.size(); ++i) {
    const ojson& c = calls[i];
    const std::string ci = p + "[" + std::to_string(i) + "]";
    auto fn = c.is_object() ? c.find("function") : c.end();
    if (fn == c.end() || !fn->is_object())
      return tool_error{ci + ".function", "'" + ci + ".function' is required"};
    auto name = fn->find("name");
    auto args = fn->find("arguments");
    if (name == fn->end() || !name->is_string())
      return tool_error{ci + ".function.name", "'" + ci + ".function.name' must be a string"};
    std::string args_text = "{}";
    if (args != fn->end() && !args->is_null()) {
      if (!args->is_string())
        return tool_error{ci + ".function.arguments",
                          "'" + ci + ".function.arguments' must be a JSON string"};
      const auto parsed = ojson::parse(args->get<std::string>(), nullptr, false);
      if (parsed.is_discarded())
        return tool_error{ci + ".function.arguments",
                          "'" + ci + ".function.arguments' is not valid JSON"};
      args_text = parsed.dump();
    }
    std::string id = "call_" + std::to_string(i);
    if (auto v = c.find("id"); v != c.end() && v->is_string()) id = v->get<std::string>();
    out.push_back(
        ojson{{"id", id},
              {"type", "function"},
              {"function", {{"name", name->get<std::string>()}, {"arguments", args_text}}}});
  }
  calls_json = out.dump();
  return std::nullopt;
}

void prepare_chat_messages(const tool_config& tools, std::vector<gpu::chat_message>& messages,
                           bool template_renders_tools) {
  if (template_renders_tools) return;
  for (auto& m : messages) {
    if (m.role == "tool") {
      m.role = "user";
      m.content = tool_response_text(m.content);
      m.tool_call_id.clear();
    }
    if (!m.tool_calls.empty()) {
      // Validated when the request was read.
      const auto calls = ojson::parse(m.tool_calls, nullptr, false);
      std::string text;
      for (const auto& c : calls.is_array() ? calls : ojson::array()) {
        if (!text.empty()) text += '\n';
        text += tool_call_text(c["function"]["name"].get<std::string>(),
                               c["function"]["arguments"].get<std::string>());
      }
      m.content += (m.content.empty() ? "" : "\n") + text;
      m.tool_calls.clear();
    }
  }
  add_tools_to_messages(tools, messages);
}

std::string tools_json(const tool_config& tools) {
  if (!tools.active()) return {};
  ojson out = ojson::array();
  for (const auto& t : tools.tools) {
    ojson fn{{"name", t.name}};
    if (!t.description.empty()) fn["description"] = t.description;
    fn["parameters"] = t.parameters;
    out.push_back(ojson{{"type", "function"}, {"function", std::move(fn)}});
  }
  return out.dump();
}

std::string tool_call_text(std::string_view name, std::string_view arguments_json) {
  return std::string(kOpen) + "\n{\"name\": " + ojson(std::string(name)).dump() +
         ", \"arguments\": " + std::string(arguments_json) + "}\n" + std::string(kClose);
}

std::string tool_response_text(std::string_view content) {
  return "<tool_response>\n" + std::string(content) + "\n</tool_response>";
}

void add_tools_to_messages(const tool_config& tools, std::vector<gpu::chat_message>& messages) {
  if (!tools.active()) return;
  std::string text =
      "You can call functions to help answer. Their definitions, one JSON object per line, are "
      "inside <tools></tools>:\n<tools>\n";
  for (const auto& t : tools.tools) {
    ojson fn{{"name", t.name}};
    if (!t.description.empty()) fn["description"] = t.description;
    fn["parameters"] = t.parameters;
    text += ojson{{"type", "function"}, {"function", fn}}.dump() + "\n";
  }
  text +=
      "</tools>\nTo call a function, write a JSON object with its name and arguments inside "
      "<tool_call></tool_call> tags:\n" +
      tool_call_text("function_name", "{\"argument\": \"value\"}") + "\n";
  text += tools.parallel ? "You may call several functions, one block each.\n"
                         : "Call at most one function per answer.\n";
  if (tools.choice == tool_choice::required) text += "You must call a function.\n";
  if (tools.choice == tool_choice::named) text += "You must call " + tools.named + ".\n";
  text += "Each result comes back inside <tool_response></tool_response> tags.";
  if (!messages.empty() && messages.front().role == "system") {
    messages.front().content = text + "\n\n" + messages.front().content;
  } else {
    messages.insert(messages.begin(), gpu::chat_message{"system", std::move(text)});
  }
}

gpu::result<std::optional<std::string>> tool_call_grammar(const tool_config& tools) {
  if (tools.choice != tool_choice::required && tools.choice != tool_choice::named)
    return std::optional<std::string>{};
  // Llama 3.1 names the arguments "parameters".
  const char* args_key = tools.format == tool_format::llama3_json ? "parameters" : "arguments";
  auto one = [args_key](const tool_function& f) {
    return ojson{{"type", "object"},
                 {"properties", {{"name", {{"const", f.name}}}, {args_key, f.parameters}}},
                 {"required", {"name", args_key}}};
  };
  ojson schema;
  if (tools.choice == tool_choice::named) {
    schema = one(*tools.find(tools.named));
  } else {
    schema = ojson{{"anyOf", ojson::array()}};
    for (const auto& t : tools.tools) schema["anyOf"].push_back(one(t));
  }
  auto g = gpu::grammar::json_schema_to_gbnf(schema.dump());
  if (!g) {
    return gpu::status{gpu::status_code::invalid_argument,
                       "the tools' parameter schemas cannot be enforced: " + g.error().message()};
  }
  constexpr std::string_view root = "root ::= ";
  std::string body = g->substr(root.size());  // json_schema_to_gbnf starts with the root rule
  const bool many = tools.choice == tool_choice::required && tools.parallel;
  std::string out;
  switch (tools.format) {
    case tool_format::tagged:
      out = many ? "root ::= tc-block (\"\\n\" tc-block)*\n" : "root ::= tc-block\n";
      out += "tc-block ::= \"<tool_call>\\n\" tc-call \"\\n</tool_call>\"\n";
      break;
    case tool_format::llama3_json:
      out = many ? "root ::= tc-call (\"; \" tc-call)*\n" : "root ::= tc-call\n";
      break;
    case tool_format::mistral:
      out = many ? "root ::= \"[\" tc-call (\", \" tc-call)* \"]\"\n"
                 : "root ::= \"[\" tc-call \"]\"\n";
      break;
  }
  out += "tc-call ::= " + body;
  return std::optional<std::string>{std::move(out)};
}

tool_call_parser::tool_call_parser(const tool_config& tools, std::string id_prefix)
    : tools_(tools), id_prefix_(std::move(id_prefix)) {}

void tool_call_parser::emit_content(std::string_view text, output& out) {
  // Whitespace waits: it is shown once content follows, dropped when a call follows.
  size_t last = text.size();
  while (last > 0 && is_space(text[last - 1])) --last;
  if (last == 0) {
    pending_ws_.append(text);
    return;
  }
  out.content += pending_ws_;
  pending_ws_.clear();
  out.content.append(text.substr(0, last));
  pending_ws_.append(text.substr(last));
}

std::optional<tool_call> tool_call_parser::call_of(const ojson& j) const {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  const tool_function* f = tools_.find(j["name"].get<std::string>());
  if (f == nullptr) return std::nullopt;
  ojson args = ojson::object();
  const char* key = j.contains("arguments") ? "arguments" : "parameters";
  if (j.contains(key)) {
    args = j[key];
    if (args.is_string()) args = ojson::parse(args.get<std::string>(), nullptr, false);
  }
  if (!args.is_object()) return std::nullopt;
  return tool_call{0, "", f->name, args.dump()};
}

void tool_call_parser::close_block(std::string_view body, output& out) {
  auto call = call_of(ojson::parse(trim(body), nullptr, false));
  if (!call) {
    // Not a call of a listed tool: the text stays, as the model wrote it.
    emit_content(std::string(kOpen) + std::string(body) + std::string(kClose), out);
    return;
  }
  pending_ws_.clear();
  call->index = n_calls_;
  call->id = id_prefix_ + std::to_string(n_calls_);
  out.calls.push_back(std::move(*call));
  ++n_calls_;
}

tool_call_parser::output tool_call_parser::feed(std::string_view text) {
  if (tools_.format != tool_format::tagged) return feed_whole(text);
  output out;
  buf_.append(text);
  while (true) {
    if (in_block_) {
      const size_t end = buf_.find(kClose);
      if (end == std::string::npos) break;
      close_block(std::string_view(buf_).substr(0, end), out);
      buf_.erase(0, end + kClose.size());
      in_block_ = false;
      continue;
    }
    const size_t start = buf_.find(kOpen);
    if (start != std::string::npos) {
      emit_content(std::string_view(buf_).substr(0, start), out);
      buf_.erase(0, start + kOpen.size());
      in_block_ = true;
      continue;
    }
    // Hold back a tail that could be the start of the opening tag.
    size_t keep = 0;
    for (size_t k = std::min(buf_.size(), kOpen.size() - 1); k > 0; --k) {
      if (std::string_view(buf_).substr(buf_.size() - k) == kOpen.substr(0, k)) {
        keep = k;
        break;
      }
    }
    emit_content(std::string_view(buf_).substr(0, buf_.size() - keep), out);
    buf_.erase(0, buf_.size() - keep);
    break;
  }
  return out;
}

tool_call_parser::output tool_call_parser::finish() {
  if (tools_.format != tool_format::tagged) return finish_whole();
  output out;
  if (in_block_) {
    emit_content(std::string(kOpen) + buf_, out);
  } else {
    emit_content(buf_, out);
  }
  buf_.clear();
  in_block_ = false;
  if (n_calls_ == 0) out.content += pending_ws_;
  pending_ws_.clear();
  return out;
}

tool_call_parser::output parse_tool_output(std::string_view text, const tool_config& tools,
                                           const std::string& id_prefix) {
  tool_call_parser p(tools, id_prefix);
  auto a = p.feed(text);
  auto b = p.finish();
  a.content += b.content;
  for (auto& c : b.calls) a.calls.push_back(std::move(c));
  return a;
}

}  // namespace weft::serve
