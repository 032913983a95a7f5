#include "actors/serve/openai_api.hpp"

#include <charconv>
#include <cmath>
#include <utility>

#include <nlohmann/json.hpp>

// The OpenAI protocol's responses (docs/serving.md, "API"): whole responses, SSE chunks, errors
// and the model list; the request side is openai_api.cpp.
namespace weft::serve {

namespace {

// Responses keep OpenAI's field order (id, object, created, ...), which makes them easier to read.
using ojson = nlohmann::ordered_json;

// -- response rendering ---------------------------------------------------------------------------

// A float log-probability as the double whose shortest form is the float's (-0.1, not
// -0.10000000149011612). -inf (impossible tokens) becomes -9999, as JSON has no infinity.
double json_logprob(float lp) {
  if (!std::isfinite(lp)) return -9999.0;
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, lp);
  double d = lp;
  if (ec == std::errc{}) std::from_chars(buf, end, d);
  return d;
}

ojson bytes_json(const std::vector<uint8_t>& bytes) {
  ojson a = ojson::array();
  for (uint8_t b : bytes) a.push_back(b);
  return a;
}

ojson finish_json(const std::string& finish_reason) {
  return finish_reason.empty() ? ojson(nullptr) : ojson(finish_reason);
}

// Completions: {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}. Offsets
// count bytes of `text`; when the tokens' text ends `text` (echo puts the prompt first), they
// start where it does, otherwise at 0.
ojson completion_logprobs(const choice_result& c) {
  ojson tokens = ojson::array(), token_logprobs = ojson::array(), top = ojson::array(),
        offsets = ojson::array();
  std::string joined;
  for (const auto& e : c.logprobs) joined += e.token;
  size_t offset = 0;
  if (joined.size() <= c.text.size() &&
      c.text.compare(c.text.size() - joined.size(), joined.size(), joined) == 0) {
    offset = c.text.size() - joined.size();
  }
  for (const auto& e : c.logprobs) {
    tokens.push_back(e.token);
    token_logprobs.push_back(json_logprob(e.logprob));
    ojson alts = ojson::object();
    for (const auto& a : e.top) {
      // Two tokens may share a text; the better one (first) stays.
      if (!alts.contains(a.token)) alts[a.token] = json_logprob(a.logprob);
    }
    top.push_back(std::move(alts));
    offsets.push_back(offset);
    offset += e.token.size();
  }
  ojson lp = ojson::object();
  lp["tokens"] = std::move(tokens);
  lp["token_logprobs"] = std::move(token_logprobs);
  lp["top_logprobs"] = std::move(top);
  lp["text_offset"] = std::move(offsets);
  return lp;
}

// Chat: {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}.
ojson chat_logprobs(const choice_result& c) {
  ojson content = ojson::array();
  for (const auto& e : c.logprobs) {
    ojson t = ojson::object();
    t["token"] = e.token;
    t["logprob"] = json_logprob(e.logprob);
    t["bytes"] = bytes_json(e.bytes);
    ojson alts = ojson::array();
    for (const auto& a : e.top) {
      ojson x = ojson::object();
      x["token"] = a.token;
      x["logprob"] = json_logprob(a.logprob);
      x["bytes"] = bytes_json(a.bytes);
      alts.push_back(std::move(x));
    }
    t["top_logprobs"] = std::move(alts);
    content.push_back(std::move(t));
  }
  ojson lp = ojson::object();
  lp["content"] = std::move(content);
  return lp;
}

ojson logprobs_json(endpoint kind, const choice_result& c, bool with_logprobs) {
  if (!with_logprobs) return nullptr;
  return kind == endpoint::completions ? completion_logprobs(c) : chat_logprobs(c);
}

// OpenAI's tool_calls entries (a streamed delta also carries each call's index).
ojson tool_calls_json(const std::vector<tool_call>& calls, bool with_index) {
  ojson out = ojson::array();
  for (const auto& c : calls) {
    ojson x = ojson::object();
    if (with_index) x["index"] = c.index;
    x["id"] = c.id;
    x["type"] = "function";
    x["function"] = ojson{{"name", c.name}, {"arguments", c.arguments}};
    out.push_back(std::move(x));
  }
  return out;
}

ojson usage_json(const usage_info& u) {
  ojson j = ojson::object();
  j["prompt_tokens"] = u.prompt_tokens;
  j["completion_tokens"] = u.completion_tokens;
  j["total_tokens"] = u.prompt_tokens + u.completion_tokens;
  j["prompt_tokens_details"] = ojson{{"cached_tokens", u.cached_tokens}};
  return j;
}

ojson head_json(const response_meta& meta, const char* object) {
  ojson j = ojson::object();
  j["id"] = meta.id;
  j["object"] = object;
  j["created"] = meta.created;
  j["model"] = meta.model;
  j["system_fingerprint"] = meta.system_fingerprint;
  return j;
}

ojson error_json(const api_error& e) {
  ojson inner = ojson::object();
  inner["message"] = e.message;
  inner["type"] = e.type;
  inner["param"] = e.param.empty() ? ojson(nullptr) : ojson(e.param);
  inner["code"] = e.code.empty() ? ojson(nullptr) : ojson(e.code);
  return ojson{{"error", std::move(inner)}};
}

std::string sse(const ojson& j) {
  return "data: " + json_text(j) + "\n\n";
}

}  // namespace

std::string json_text(const nlohmann::ordered_json& j) {
  // Token pieces may be partial UTF-8 sequences: replace invalid bytes instead of throwing.
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}
std::string render_response(endpoint kind, const response_meta& meta,
                            const std::vector<choice_result>& choices, const usage_info& usage,
                            bool with_logprobs) {
  const bool chat = kind == endpoint::chat_completions;
  ojson j = head_json(meta, chat ? "chat.completion" : "text_completion");
  ojson out = ojson::array();
  for (const auto& c : choices) {
    ojson x = ojson::object();
    x["index"] = c.index;
    if (chat) {
      ojson m{{"role", "assistant"}, {"content", c.text}};
      if (!c.tool_calls.empty()) {
        if (c.text.empty()) m["content"] = nullptr;
        m["tool_calls"] = tool_calls_json(c.tool_calls, false);
      }
      x["message"] = std::move(m);
    } else {
      x["text"] = c.text;
    }
    x["logprobs"] = logprobs_json(kind, c, with_logprobs);
    x["finish_reason"] = finish_json(c.finish_reason);
    out.push_back(std::move(x));
  }
  j["choices"] = std::move(out);
  j["usage"] = usage_json(usage);
  return json_text(j);
}

std::string render_chunk(endpoint kind, const response_meta& meta, const choice_result& delta,
                         bool first, bool with_logprobs, bool include_usage) {
  const bool chat = kind == endpoint::chat_completions;
  ojson j = head_json(meta, chat ? "chat.completion.chunk" : "text_completion");
  ojson x = ojson::object();
  x["index"] = delta.index;
  if (chat) {
    // The first delta names the role; later ones carry only new content (none in a bare finish).
    ojson d = ojson::object();
    if (first) d["role"] = "assistant";
    if (first || !delta.text.empty()) d["content"] = delta.text;
    if (!delta.tool_calls.empty()) d["tool_calls"] = tool_calls_json(delta.tool_calls, true);
    x["delta"] = std::move(d);
  } else {
    x["text"] = delta.text;
  }
  x["logprobs"] = logprobs_json(kind, delta, with_logprobs);
  x["finish_reason"] = finish_json(delta.finish_reason);
  j["choices"] = ojson::array({std::move(x)});
  if (include_usage) j["usage"] = nullptr;
  return sse(j);
}

std::string render_usage_chunk(endpoint kind, const response_meta& meta, const usage_info& usage) {
  ojson j = head_json(
      meta, kind == endpoint::chat_completions ? "chat.completion.chunk" : "text_completion");
  j["choices"] = ojson::array();
  j["usage"] = usage_json(usage);
  return sse(j);
}

std::string render_done() {
  return "data: [DONE]\n\n";
}

std::string render_error_event(const api_error& e) {
  return sse(error_json(e));
}

std::string render_error(const api_error& e) {
  return json_text(error_json(e));
}

std::string render_model(const std::string& model_id, int64_t created, int64_t max_model_len) {
  ojson m = ojson::object();
  m["id"] = model_id;
  m["object"] = "model";
  m["created"] = created;
  m["owned_by"] = "weft";
  m["max_model_len"] = max_model_len;
  return json_text(m);
}

std::string render_models(const std::vector<std::string>& model_ids, int64_t created) {
  ojson data = ojson::array();
  for (const auto& id : model_ids) {
    ojson m = ojson::object();
    m["id"] = id;
    m["object"] = "model";
    m["created"] = created;
    m["owned_by"] = "weft";
    data.push_back(std::move(m));
  }
  ojson j = ojson::object();
  j["object"] = "list";
  j["data"] = std::move(data);
  return json_text(j);
}
}  // namespace weft::serve
