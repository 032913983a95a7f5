// The tokenizer endpoints of the OpenAI-compatible API (docs/serving.md): POST /tokenize in
// llama-server's and vLLM's forms (text, or chat messages through the chat template) and
// POST /detokenize.
#include <nlohmann/json.hpp>

#include "actors/serve/openai_api.hpp"

namespace weft::serve {

using ojson = nlohmann::ordered_json;

namespace {

http_reply bad_request(const std::string& message, const std::string& param) {
  return http_reply{400, render_error(api_error{400, "invalid_request_error", message, param, ""})};
}

/// An optional boolean field: absent -> fallback; not a boolean -> an error naming it.
std::optional<bool> flag(const nlohmann::json& j, const char* name, bool fallback,
                         std::string& error) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    error = std::string("'") + name + "' must be a boolean";
    return std::nullopt;
  }
  return it->get<bool>();
}

}  // namespace

http_reply tokenize_request(std::string_view body, const gpu::tokenizer& tok,
                            const gpu::chat_template* tmpl, int64_t max_model_len) {
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return bad_request("the body is not a JSON object", "");
  std::string error;
  const auto with_pieces = flag(j, "with_pieces", false, error);
  const auto add_generation_prompt = flag(j, "add_generation_prompt", true, error);
  // llama-server's add_special defaults to false, vLLM's add_special_tokens to true.
  const auto add_special = j.contains("add_special") ? flag(j, "add_special", false, error)
                                                     : flag(j, "add_special_tokens", true, error);
  const auto parse_special = flag(j, "parse_special", false, error);
  if (!error.empty()) return bad_request(error, "");
  std::vector<int32_t> ids;
  if (j.contains("messages")) {
    if (tmpl == nullptr) {
      return bad_request("this model has no chat template; send \"prompt\" text", "messages");
    }
    auto parsed = parse_request(endpoint::chat_completions, body);
    if (!parsed.request) {
      return http_reply{parsed.error.http_status, render_error(parsed.error)};
    }
    auto text = render_chat_prompt(
        *tmpl, *parsed.request,
        *add_generation_prompt ? gpu::generation_prompt::add : gpu::generation_prompt::omit);
    if (!text) return bad_request(text.error().to_string(), "messages");
    ids = tok.encode(*text, gpu::add_special::yes, gpu::parse_special::yes);
  } else {
    const char* field = j.contains("content") ? "content" : "prompt";
    auto it = j.find(field);
    if (it == j.end() || !it->is_string()) {
      return bad_request(
          "send the text as a string in \"content\" or \"prompt\", or chat "
          "\"messages\"",
          field);
    }
    ids = tok.encode(it->get<std::string>(),
                     *add_special ? gpu::add_special::yes : gpu::add_special::no,
                     *parse_special ? gpu::parse_special::yes : gpu::parse_special::no);
  }
  ojson out = ojson::object();
  ojson tokens = ojson::array();
  for (int32_t id : ids) {
    if (*with_pieces) {
      ojson t = ojson::object();
      t["id"] = id;
      t["piece"] = tok.token_to_piece(id, gpu::render_special::yes);
      tokens.push_back(std::move(t));
    } else {
      tokens.push_back(id);
    }
  }
  out["tokens"] = std::move(tokens);
  out["count"] = ids.size();
  out["max_model_len"] = max_model_len;
  return http_reply{200, json_text(out)};
}

http_reply detokenize_request(std::string_view body, const gpu::tokenizer& tok) {
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return bad_request("the body is not a JSON object", "");
  auto it = j.find("tokens");
  if (it == j.end() || !it->is_array()) {
    return bad_request("send \"tokens\": an array of token ids", "tokens");
  }
  std::vector<int32_t> ids;
  const auto n_vocab = static_cast<int64_t>(tok.n_vocab());
  for (const auto& t : *it) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= n_vocab) {
      return bad_request("token " + t.dump() + " is not a token id of this model (0.." +
                             std::to_string(n_vocab - 1) + ")",
                         "tokens");
    }
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  const std::string text = tok.decode(ids);
  ojson out = ojson::object();
  out["content"] = text;
  out["prompt"] = text;
  return http_reply{200, json_text(out)};
}

}  // namespace weft::serve
