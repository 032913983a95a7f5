#include "actors/serve/openai_api.hpp"

#include "gpu/grammar.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <exception>
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

namespace weft::serve {

namespace {

using json = nlohmann::json;

// -- request parsing ------------------------------------------------------------------------------

api_error invalid(std::string param, std::string message) {
  return api_error{400, "invalid_request_error", std::move(message), std::move(param), ""};
}

// A JSON value for an error message, cut short so a huge field does not flood the error.
std::string shown(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  constexpr size_t max_shown = 60;
  if (s.size() > max_shown) {
    s.resize(max_shown);
    s += "...";
  }
  return s;
}

std::string shown_number(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc{} ? std::string(buf, end) : std::string("?");
}

// Reads typed fields of one JSON object; remembers the first error. Every getter returns nullopt
// when the field is absent or null (OpenAI treats an explicit null as "not given") or invalid.
class field_reader {
 public:
  explicit field_reader(const json& object) : object_(object) {}

  bool failed() const { return error_.has_value(); }
  const api_error& error() const { return *error_; }

  void fail(std::string param, std::string message) {
    if (!error_) error_ = invalid(std::move(param), std::move(message));
  }

  // The field's value, nullptr when absent or null.
  const json* get(const char* name) const {
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::optional<bool> boolean(const char* name) {
    const json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) {
      fail(name, std::string("'") + name + "' must be a boolean, got " + shown(*v));
      return std::nullopt;
    }
    return v->get<bool>();
  }

  std::optional<std::string> string(const char* name) {
    const json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_string()) {
      fail(name, std::string("'") + name + "' must be a string, got " + shown(*v));
      return std::nullopt;
    }
    return v->get<std::string>();
  }

  // A number within [lo, hi] (or (lo, hi] when lo_open).
  std::optional<double> number(const char* name, double lo, double hi, bool lo_open = false) {
    const json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_number()) {
      fail(name, std::string("'") + name + "' must be a number, got " + shown(*v));
      return std::nullopt;
    }
    const double x = v->get<double>();
    const bool low_ok = lo_open ? x > lo : x >= lo;
    if (!low_ok || !(x <= hi)) {
      fail(name, std::string("'") + name + "' must be " + (lo_open ? "greater than " : "between ") +
                     shown_number(lo) + (lo_open ? " and at most " : " and ") + shown_number(hi) +
                     ", got " + shown(*v));
      return std::nullopt;
    }
    return x;
  }

  // An integer within [lo, hi]. Integral floats (16.0) are accepted, as JSON does not distinguish.
  std::optional<int64_t> integer(const char* name, int64_t lo, int64_t hi) {
    const json* v = get(name);
    if (!v) return std::nullopt;
    auto x = as_integer(*v);
    if (!x) {
      fail(name, std::string("'") + name + "' must be an integer, got " + shown(*v));
      return std::nullopt;
    }
    if (*x < lo || *x > hi) {
      fail(name, std::string("'") + name + "' must be between " + std::to_string(lo) + " and " +
                     std::to_string(hi) + ", got " + shown(*v));
      return std::nullopt;
    }
    return x;
  }

  // nullopt when `v` is not an integer representable as int64.
  static std::optional<int64_t> as_integer(const json& v) {
    if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<int64_t>();
    if (v.is_number_unsigned()) {
      const auto u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
      return static_cast<int64_t>(u);
    }
    if (v.is_number_float()) {
      const double d = v.get<double>();
      constexpr double max_exact = 9007199254740992.0;  // 2^53
      if (std::isfinite(d) && std::trunc(d) == d && std::fabs(d) <= max_exact)
        return static_cast<int64_t>(d);
    }
    return std::nullopt;
  }

 private:
  const json& object_;
  std::optional<api_error> error_;
};

// The completions "prompt": a string, a list of strings, a list of token ids or a list of lists.
void read_prompt(field_reader& rd, openai_request& r, const api_limits& limits) {
  const json* p = rd.get("prompt");
  if (!p) {
    rd.fail("prompt", "'prompt' is required");
    return;
  }
  // One request may carry a batch of prompts, but not an unbounded one.
  if (p->is_array() && !p->empty() && !p->front().is_number() &&
      p->size() > static_cast<size_t>(limits.max_prompts)) {
    rd.fail("prompt", "'prompt' holds " + std::to_string(p->size()) + " prompts; at most " +
                          std::to_string(limits.max_prompts) + " per request");
    return;
  }
  auto token_list = [&](const json& arr,
                        const std::string& param) -> std::optional<std::vector<int32_t>> {
    std::vector<int32_t> ids;
    ids.reserve(arr.size());
    for (const auto& t : arr) {
      auto x = field_reader::as_integer(t);
      if (!x || *x < 0 || *x > std::numeric_limits<int32_t>::max()) {
        rd.fail(param, "'" + param + "' must hold non-negative token ids, got " + shown(t));
        return std::nullopt;
      }
      ids.push_back(static_cast<int32_t>(*x));
    }
    if (ids.empty()) {
      rd.fail(param, "'" + param + "' must not be an empty list of token ids");
      return std::nullopt;
    }
    return ids;
  };
  if (p->is_string()) {
    r.prompts.push_back(p->get<std::string>());
    return;
  }
  if (!p->is_array()) {
    rd.fail("prompt", "'prompt' must be a string, a list of strings or a list of token ids, got " +
                          shown(*p));
    return;
  }
  if (p->empty()) {
    rd.fail("prompt", "'prompt' must not be empty");
    return;
  }
  const json& first = p->front();
  if (first.is_string()) {
    for (size_t i = 0; i < p->size(); ++i) {
      const json& e = (*p)[i];
      if (!e.is_string()) {
        rd.fail("prompt", "'prompt[" + std::to_string(i) +
                              "]' must be a string like the others, got " + shown(e));
        return;
      }
      r.prompts.push_back(e.get<std::string>());
    }
  } else if (first.is_number()) {
    auto ids = token_list(*p, "prompt");
    if (ids) r.prompt_token_ids.push_back(std::move(*ids));
  } else if (first.is_array()) {
    for (size_t i = 0; i < p->size(); ++i) {
      const json& e = (*p)[i];
      const std::string param = "prompt[" + std::to_string(i) + "]";
      if (!e.is_array()) {
        rd.fail("prompt",
                "'" + param + "' must be a list of token ids like the others, got " + shown(e));
        return;
      }
      auto ids = token_list(e, param);
      if (!ids) return;
      r.prompt_token_ids.push_back(std::move(*ids));
    }
  } else {
    rd.fail("prompt", "'prompt' must be a string, a list of strings or a list of token ids, got " +
                          shown(*p));
  }
}

// The chat "messages": [{role, content}], content a string or a list of {type: "text", text} parts
// (joined with "\n"). "developer" is OpenAI's newer name for "system".
void read_messages(field_reader& rd, openai_request& r) {
  const json* m = rd.get("messages");
  if (!m) {
    rd.fail("messages", "'messages' is required");
    return;
  }
  if (!m->is_array()) {
    rd.fail("messages", "'messages' must be a list of messages, got " + shown(*m));
    return;
  }
  if (m->empty()) {
    rd.fail("messages", "'messages' must not be empty");
    return;
  }
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) {
      rd.fail(at, "'" + at + "' must be an object, got " + shown(msg));
      return;
    }
    gpu::chat_message out;
    auto role = msg.find("role");
    if (role == msg.end() || !role->is_string()) {
      rd.fail(at + ".role", "'" + at + ".role' is required and must be a string");
      return;
    }
    out.role = role->get<std::string>();
    if (out.role == "developer") out.role = "system";
    if (out.role != "system" && out.role != "user" && out.role != "assistant" &&
        out.role != "tool") {
      rd.fail(at + ".role",
              "'" + at +
                  ".role' must be one of 'system', 'developer', 'user', 'assistant', 'tool', got " +
                  shown(*role) +
                  (out.role == "function" ? " (use 'tool': 'function' messages are legacy)" : ""));
      return;
    }
    const std::string cp = at + ".content";
    auto content = msg.find("content");
    if (content == msg.end() || content->is_null()) {
      // OpenAI allows a null content only on assistant messages (that carry tool calls).
      if (out.role != "assistant") {
        rd.fail(cp, "'" + cp + "' is required");
        return;
      }
    } else if (content->is_string()) {
      out.content = content->get<std::string>();
    } else if (content->is_array()) {
      for (size_t j = 0; j < content->size(); ++j) {
        const json& part = (*content)[j];
        const std::string pp = cp + "[" + std::to_string(j) + "]";
        if (!part.is_object()) {
          rd.fail(pp, "'" + pp + "' must be an object {type, text}, got " + shown(part));
          return;
        }
        auto type = part.find("type");
        if (type == part.end() || !type->is_string() || type->get<std::string>() != "text") {
          rd.fail(pp + ".type", "only content parts of type 'text' are supported, got " +
                                    (type == part.end() ? std::string("none") : shown(*type)));
          return;
        }
        auto text = part.find("text");
        if (text == part.end() || !text->is_string()) {
          rd.fail(pp + ".text", "'" + pp + ".text' is required and must be a string");
          return;
        }
        if (j > 0) out.content += '\n';
        out.content += text->get<std::string>();
      }
    } else {
      rd.fail(cp, "'" + cp + "' must be a string or a list of text parts, got " + shown(*content));
      return;
    }
    if (out.role == "tool") {
      // A tool's result: how the model reads it depends on the template (prepare_chat_messages).
      if (auto id = msg.find("tool_call_id"); id != msg.end() && id->is_string())
        out.tool_call_id = id->get<std::string>();
    }
    if (auto calls = msg.find("tool_calls"); calls != msg.end() && !calls->is_null()) {
      if (out.role != "assistant") {
        rd.fail(at + ".tool_calls", "only assistant messages carry 'tool_calls'");
        return;
      }
      if (auto e = read_message_tool_calls(nlohmann::ordered_json::parse(calls->dump()), at,
                                           out.tool_calls)) {
        rd.fail(e->param, e->message);
        return;
      }
    }
    r.messages.push_back(std::move(out));
  }
}

// Fields that change the result but that weft does not implement are refused rather than
// ignored: a client must not believe it got what it asked for.
void refuse_unsupported(field_reader& rd, const openai_request& r) {
  if (r.kind == endpoint::completions) {
    if (const json* s = rd.get("suffix")) {
      if (!s->is_string()) {
        rd.fail("suffix", "'suffix' must be a string, got " + shown(*s));
      } else if (!s->get<std::string>().empty()) {
        rd.fail("suffix", "'suffix' is not supported");
      }
    }
    if (auto best_of = rd.integer("best_of", 1, std::numeric_limits<int32_t>::max())) {
      if (*best_of != r.n) rd.fail("best_of", "'best_of' other than n is not supported");
    }
  } else {
    if (const json* t = rd.get("functions")) {
      if (!t->is_array()) {
        rd.fail("functions", "'functions' must be a list, got " + shown(*t));
      } else if (!t->empty()) {
        rd.fail("functions", "'functions' (legacy) is not supported: use 'tools'");
      }
    }
  }
}

// Tool calling (tool_calls.hpp): the tools go into the system turn; a required or named call is
// enforced by a grammar, which cannot be combined with another structured output.
void read_tools(field_reader& rd, openai_request& r, std::string_view body) {
  const auto ordered = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (ordered.is_discarded()) return;  // the body parsed as JSON already; cannot happen
  if (auto e = read_tool_config(ordered, r.tools)) {
    rd.fail(e->param, e->message);
    return;
  }
  auto g = tool_call_grammar(r.tools);
  if (!g) {
    rd.fail("tools", g.error().message());
    return;
  }
  if (!g->has_value()) return;
  if (!r.sampling.grammar.empty()) {
    rd.fail("tool_choice",
            "a required tool call cannot be combined with response_format or a grammar");
    return;
  }
  if (r.ignore_eos) {
    rd.fail("ignore_eos", "'ignore_eos' cannot be combined with a required tool call");
    return;
  }
  r.sampling.grammar = std::move(**g);
}

// Structured outputs (docs/serving.md): OpenAI's response_format (json_object, json_schema),
// llama.cpp's `grammar` (GBNF) and `json_schema`, vLLM's `guided_json` and `guided_grammar`. At
// most one; the grammar text is compiled here so a bad schema or grammar is a 400 naming what is
// wrong, and travels with the request to the worker.
void read_structured(field_reader& rd, openai_request& r, std::string_view body) {
  std::string source, text;
  auto take = [&](const char* field, gpu::result<std::string> g) {
    if (!source.empty()) {
      rd.fail(field, std::string("'") + field + "' cannot be combined with '" + source + "'");
      return;
    }
    if (!g) {
      rd.fail(field, g.error().message());
      return;
    }
    source = field;
    text = std::move(*g);
  };
  // The schema again from the body, in its declared key order (nlohmann::json sorts keys): the
  // properties are generated in the order the schema lists them, as OpenAI does.
  const auto ordered = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  auto schema_text = [&](const json& v,
                         const std::vector<std::string>& path) -> gpu::result<std::string> {
    if (v.is_string()) return gpu::grammar::json_schema_to_gbnf(v.get<std::string>());
    if (!v.is_object() && !v.is_boolean())
      return gpu::status{gpu::status_code::invalid_argument, "a JSON Schema must be an object"};
    const nlohmann::ordered_json* o = &ordered;
    for (const auto& k : path) {
      if (o == nullptr || !o->is_object() || !o->contains(k)) {
        o = nullptr;
        break;
      }
      o = &(*o)[k];
    }
    return gpu::grammar::json_schema_to_gbnf(o != nullptr ? o->dump() : v.dump());
  };
  if (const json* f = rd.get("response_format")) {
    auto type = f->is_object() ? f->find("type") : f->end();
    if (!f->is_object() || type == f->end() || !type->is_string()) {
      rd.fail("response_format", "'response_format' must be an object with a string 'type'");
      return;
    }
    const std::string t = type->get<std::string>();
    if (t == "json_object") {
      take("response_format", gpu::grammar::json_object_gbnf());
    } else if (t == "json_schema") {
      auto js = f->find("json_schema");
      if (js == f->end() || !js->is_object() || !js->contains("schema")) {
        rd.fail("response_format",
                "'response_format' of type json_schema needs 'json_schema': {\"name\": ..., "
                "\"schema\": {...}}");
        return;
      }
      take("response_format",
           schema_text((*js)["schema"], {"response_format", "json_schema", "schema"}));
    } else if (t != "text") {
      rd.fail("response_format", "'response_format' of type " + shown(*type) +
                                     " is not supported (text, json_object, json_schema)");
      return;
    }
  }
  for (const char* field : {"json_schema", "guided_json"}) {
    if (const json* v = rd.get(field)) take(field, schema_text(*v, {field}));
  }
  for (const char* field : {"grammar", "guided_grammar"}) {
    if (const json* v = rd.get(field)) {
      if (!v->is_string()) {
        rd.fail(field, std::string("'") + field + "' must be a GBNF string, got " + shown(*v));
        return;
      }
      take(field, v->get<std::string>());
    }
  }
  if (rd.failed() || source.empty()) return;
  if (auto g = gpu::grammar::grammar::parse(text); !g) {
    rd.fail(source, g.error().message());
    return;
  }
  if (r.ignore_eos) {
    rd.fail("ignore_eos", "'ignore_eos' cannot be combined with '" + source +
                              "': a structured output ends with the end-of-text token");
    return;
  }
  r.sampling.grammar = std::move(text);
}

// OpenAI's {"token id": bias}: ids as decimal strings, biases in [-100, 100]. The server checks
// the ids against the vocabulary (api_server_generate.cpp).
void read_logit_bias(field_reader& rd, gpu::sampling_params& s) {
  const json* lb = rd.get("logit_bias");
  if (!lb) return;
  if (!lb->is_object()) {
    rd.fail("logit_bias", "'logit_bias' must be an object of token id -> bias, got " + shown(*lb));
    return;
  }
  if (lb->size() > gpu::kMaxLogitBias) {
    rd.fail("logit_bias", "'logit_bias' has " + std::to_string(lb->size()) + " entries; at most " +
                              std::to_string(gpu::kMaxLogitBias));
    return;
  }
  for (const auto& [key, value] : lb->items()) {
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc{} || end != key.data() + key.size() || key.empty() || id < 0 ||
        id > std::numeric_limits<int32_t>::max()) {
      rd.fail("logit_bias", "'logit_bias' keys are token ids (non-negative integers), got \"" +
                                key.substr(0, 64) + "\"");
      return;
    }
    if (!value.is_number() || !(value.get<double>() >= -100.0 && value.get<double>() <= 100.0)) {
      rd.fail("logit_bias", "'logit_bias' of token " + key +
                                " must be a number in [-100, 100], got " + shown(value));
      return;
    }
    s.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(value.get<double>()));
  }
  std::sort(s.logit_bias.begin(), s.logit_bias.end());
}

void read_sampling(field_reader& rd, openai_request& r, const api_limits& limits) {
  auto& s = r.sampling;
  s.temperature = 1.0f;  // OpenAI's default; 0 is greedy in our sampler
  s.max_tokens = -1;
  const int64_t max_tokens_limit = std::min<int64_t>(std::max<int64_t>(limits.max_tokens_limit, 1),
                                                     std::numeric_limits<int32_t>::max());

  if (auto v = rd.number("temperature", 0.0, 2.0)) s.temperature = static_cast<float>(*v);
  if (auto v = rd.number("top_p", 0.0, 1.0, /*lo_open=*/true)) s.top_p = static_cast<float>(*v);
  if (auto v = rd.integer("top_k", -1, std::numeric_limits<int32_t>::max()))
    s.top_k = *v <= 0 ? 0 : static_cast<int32_t>(*v);
  if (auto v = rd.number("min_p", 0.0, 1.0)) s.min_p = static_cast<float>(*v);
  if (auto v = rd.number("presence_penalty", -2.0, 2.0))
    s.presence_penalty = static_cast<float>(*v);
  if (auto v = rd.number("frequency_penalty", -2.0, 2.0))
    s.frequency_penalty = static_cast<float>(*v);
  if (auto v = rd.number("repetition_penalty", 0.0, std::numeric_limits<float>::max(),
                         /*lo_open=*/true)) {
    s.repetition_penalty = static_cast<float>(*v);
  }
  if (auto v = rd.integer("max_tokens", 1, max_tokens_limit))
    s.max_tokens = static_cast<int32_t>(*v);
  // vLLM's extension: lower runs first; only meaningful when the workers rank by it.
  if (auto v = rd.integer("priority", std::numeric_limits<int32_t>::min(),
                          std::numeric_limits<int32_t>::max())) {
    if (*v != 0 && !limits.priority_scheduling) {
      rd.fail("priority",
              "'priority' needs a server started with --policy priority (this one schedules "
              "first come, first served or by MLFQ)");
    }
    s.priority = static_cast<int32_t>(*v);
  }
  read_logit_bias(rd, s);
  if (r.kind == endpoint::chat_completions) {
    // The newer name wins when both are given.
    if (auto v = rd.integer("max_completion_tokens", 1, max_tokens_limit))
      s.max_tokens = static_cast<int32_t>(*v);
  }

  if (const json* seed = rd.get("seed")) {
    if (seed->is_number_unsigned()) {
      s.seed = seed->get<uint64_t>();
      r.has_seed = true;
    } else if (auto x = field_reader::as_integer(*seed)) {
      s.seed = static_cast<uint64_t>(*x);  // negative seeds wrap, as a 64-bit pattern
      r.has_seed = true;
    } else {
      rd.fail("seed", "'seed' must be an integer, got " + shown(*seed));
    }
  }

  if (const json* stop = rd.get("stop")) {
    if (stop->is_string()) {
      if (!stop->get<std::string>().empty()) s.stop_strings.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > static_cast<size_t>(std::max(limits.max_stop_strings, 0))) {
        rd.fail("stop", "'stop' may hold at most " + std::to_string(limits.max_stop_strings) +
                            " strings, got " + std::to_string(stop->size()));
      }
      for (const auto& e : *stop) {
        if (!e.is_string()) {
          rd.fail("stop",
                  "'stop' must be a string or a list of strings, got an element " + shown(e));
          break;
        }
        if (!e.get<std::string>().empty()) s.stop_strings.push_back(e.get<std::string>());
      }
    } else {
      rd.fail("stop", "'stop' must be a string or a list of strings, got " + shown(*stop));
    }
  }

  const int64_t max_top = std::max(limits.max_top_logprobs, 0);
  if (r.kind == endpoint::completions) {
    if (auto k = rd.integer("logprobs", 0, max_top)) {
      r.want_logprobs = true;
      r.top_logprobs = static_cast<int32_t>(*k);
    }
  } else {
    r.want_logprobs = rd.boolean("logprobs").value_or(false);
    if (auto k = rd.integer("top_logprobs", 0, max_top)) {
      if (*k > 0 && !r.want_logprobs) {
        rd.fail("top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
      }
      r.top_logprobs = static_cast<int32_t>(*k);
    }
    if (!r.want_logprobs) r.top_logprobs = 0;
  }
  // The sampler always fills the chosen token's log-probability; n_logprobs adds the alternatives.
  s.n_logprobs = r.want_logprobs ? r.top_logprobs : 0;
}

parse_result parse_object(endpoint kind, const json& body, std::string_view raw,
                          const api_limits& limits) {
  openai_request r;
  r.kind = kind;
  field_reader rd(body);

  r.model = rd.string("model").value_or("");
  if (auto n = rd.integer("n", 1, std::max(limits.max_n, 1))) r.n = static_cast<int32_t>(*n);
  r.stream = rd.boolean("stream").value_or(false);
  if (const json* so = rd.get("stream_options")) {
    if (!so->is_object()) {
      rd.fail("stream_options", "'stream_options' must be an object, got " + shown(*so));
    } else if (!r.stream) {
      rd.fail("stream_options", "'stream_options' is only allowed when 'stream' is true");
    } else {
      field_reader opts(*so);
      r.include_usage = opts.boolean("include_usage").value_or(false);
      if (opts.failed()) rd.fail("stream_options.include_usage", opts.error().message);
    }
  }
  if (kind == endpoint::completions) r.echo = rd.boolean("echo").value_or(false);
  r.ignore_eos = rd.boolean("ignore_eos").value_or(false);
  r.user = rd.string("user").value_or("");
  read_sampling(rd, r, limits);
  refuse_unsupported(rd, r);
  if (!rd.failed()) read_structured(rd, r, raw);
  r.tools.format = limits.tool_calls_format;
  if (!rd.failed() && kind == endpoint::chat_completions) read_tools(rd, r, raw);
  if (rd.failed()) return {std::nullopt, rd.error()};

  if (kind == endpoint::completions) {
    read_prompt(rd, r, limits);
  } else {
    read_messages(rd, r);
  }
  if (rd.failed()) return {std::nullopt, rd.error()};
  return {std::move(r), {}};
}

}  // namespace

parse_result parse_request(endpoint kind, std::string_view body, const api_limits& limits) {
  if (body.size() > limits.max_body_bytes) {
    return {std::nullopt, api_error{413, "invalid_request_error",
                                    "the request body has " + std::to_string(body.size()) +
                                        " bytes, more than the " +
                                        std::to_string(limits.max_body_bytes) + " allowed",
                                    "", "request_too_large"}};
  }
  try {
    const json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded()) {
      return {std::nullopt, invalid("", "the request body is not valid JSON")};
    }
    if (!parsed.is_object()) {
      return {std::nullopt, invalid("", "the request body must be a JSON object, got a " +
                                            std::string(parsed.type_name()))};
    }
    return parse_object(kind, parsed, body, limits);
  } catch (const std::exception& e) {
    // Only allocation failures can get here (every access above checks types first).
    return {std::nullopt,
            api_error{500, "server_error", std::string("could not parse the request: ") + e.what(),
                      "", ""}};
  }
}

gpu::result<std::string> render_chat_prompt(const gpu::chat_template& tmpl, const openai_request& r,
                                            gpu::generation_prompt p) {
  std::vector<gpu::chat_message> messages = r.messages;
  const bool native = tmpl.renders_tools();
  prepare_chat_messages(r.tools, messages, native);
  return tmpl.apply(messages, p, native ? tools_json(r.tools) : std::string());
}

}  // namespace weft::serve
