#pragma once
/// The OpenAI HTTP API of `weft serve`, as plain functions (no CAF, no HTTP library): parsing and
/// validating request bodies of /v1/completions and /v1/chat/completions into `openai_request`,
/// and rendering responses, SSE chunks and OpenAI-style errors. The api actor and the HTTP server
/// call these; unit tests drive them directly.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "actors/serve/tool_calls.hpp"
#include "gpu/chat_template.hpp"
#include "gpu/sampler.hpp"
#include "gpu/tokenizer.hpp"

namespace weft::serve {

/// Which endpoint a request came in on.
enum class endpoint { completions, chat_completions, embeddings };

/// An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct api_error {
  int http_status = 400;
  std::string type = "invalid_request_error";  ///< invalid_request_error, authentication_error,
                                               ///< not_found_error, rate_limit_error, server_error
  std::string message;
  std::string param;  ///< the offending field ("" when none)
  std::string code;   ///< e.g. "context_length_exceeded", "model_not_found" ("" when none)
};

/// The validated content of a completions or chat-completions request body.
struct openai_request {
  endpoint kind = endpoint::completions;
  std::string model;
  /// completions: one prompt per entry ("prompt" may be a string, a list of strings, a list of
  /// token ids or a list of lists of token ids); chat: empty.
  std::vector<std::string> prompts;
  std::vector<std::vector<int32_t>> prompt_token_ids;  ///< completions given as token ids
  std::vector<gpu::chat_message> messages;             ///< chat only; content parts joined
  int32_t n = 1;                                       ///< choices per prompt
  bool stream = false;
  bool include_usage = false;  ///< stream_options.include_usage
  bool echo = false;           ///< completions: prepend the prompt to the text
  /// Sampling fields. sampling.max_tokens is -1 when the client gave none (the server then uses
  /// what fits the context); sampling.seed is meaningful only when has_seed.
  gpu::sampling_params sampling;
  bool has_seed = false;
  /// Log-probabilities: completions `logprobs: k` (0..20) -> want_logprobs, top_logprobs = k;
  /// chat `logprobs: true` + `top_logprobs: k` (0..20).
  bool want_logprobs = false;
  int32_t top_logprobs = 0;
  bool ignore_eos = false;  ///< weft/vLLM extension
  std::string user;
  /// chat: tools, tool_choice, parallel_tool_calls (already written into `messages` and, for a
  /// required call, into sampling.grammar).
  tool_config tools;
};

/// Limits the server applies while validating.
struct api_limits {
  int32_t max_n = 16;
  int32_t max_prompts = 64;  ///< prompts in one completions request (a list of strings or of lists)
  int32_t max_top_logprobs = 20;
  int32_t max_stop_strings = 4;
  int64_t max_tokens_limit = 1 << 20;  ///< absurd max_tokens beyond this are refused
  size_t max_body_bytes = 8u << 20;
  /// How the model writes tool calls (the server's --tool-call-parser, or its template's family).
  tool_format tool_calls_format = tool_format::tagged;
  /// The workers rank requests by their `priority` field (`weft serve --policy priority`); when
  /// false a nonzero `priority` is refused (400) rather than ignored.
  bool priority_scheduling = false;
};

/// Parses and validates a body. Malformed JSON, wrong types, out-of-range values, unknown `role`,
/// empty prompt/messages -> api_error with status 400 and `param` set. Unknown fields are ignored
/// (as OpenAI does). Does not check the model name (the server does, with 404 model_not_found).
struct parse_result {
  std::optional<openai_request> request;
  api_error error;  ///< meaningful when !request
};
parse_result parse_request(endpoint kind, std::string_view body, const api_limits& limits = {});

/// One token with its log-probability, as the API reports it.
struct logprob_entry {
  std::string token;  ///< the token's text (may be a partial UTF-8 sequence)
  float logprob = 0.0f;
  std::vector<uint8_t> bytes;  ///< the token's raw bytes
  struct alt {
    std::string token;
    float logprob = 0.0f;
    std::vector<uint8_t> bytes;
  };
  std::vector<alt> top;  ///< best first
};

/// A finished or in-progress choice.
struct choice_result {
  int32_t index = 0;
  std::string text;                     ///< text (or text delta, for a chunk)
  std::vector<logprob_entry> logprobs;  ///< per token (or per new token, for a chunk)
  std::string finish_reason;  ///< "stop", "length", "tool_calls", "abort", "error" or "" (running)
  std::vector<tool_call> tool_calls;  ///< chat: calls parsed from the text (or new in a chunk)
};

struct usage_info {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  ///< usage.prompt_tokens_details.cached_tokens
};

/// Identity of a response: "cmpl-..." / "chatcmpl-..." id, creation time (unix seconds), model.
struct response_meta {
  std::string id;
  int64_t created = 0;
  std::string model;
  std::string system_fingerprint = "weft";
};

/// JSON text of a response body; invalid UTF-8 (a token piece cut mid-character) is replaced
/// instead of failing.
std::string json_text(const nlohmann::ordered_json& j);

/// The prompt of a chat request: its messages (and tools) through the chat template — given to a
/// template that renders tools as they are, otherwise in weft's tagged tool format
/// (prepare_chat_messages).
gpu::result<std::string> render_chat_prompt(const gpu::chat_template& tmpl, const openai_request& r,
                                            gpu::generation_prompt p);

/// Non-streaming body: object "text_completion" or "chat.completion", with choices, logprobs
/// (completions: {tokens, token_logprobs, top_logprobs, text_offset}; chat: {content: [{token,
/// logprob, bytes, top_logprobs}]}) when asked, and usage.
std::string render_response(endpoint kind, const response_meta& meta,
                            const std::vector<choice_result>& choices, const usage_info& usage,
                            bool with_logprobs);

/// One SSE event ("data: {...}\n\n") for a chunk of one choice: object "text_completion" or
/// "chat.completion.chunk" (chat deltas: the first chunk of a choice carries role "assistant").
/// `first` marks that first chunk. usage is null in every chunk when include_usage is set.
std::string render_chunk(endpoint kind, const response_meta& meta, const choice_result& delta,
                         bool first, bool with_logprobs, bool include_usage);
/// The final usage-only chunk (choices: []) sent when stream_options.include_usage is set.
std::string render_usage_chunk(endpoint kind, const response_meta& meta, const usage_info& usage);
/// "data: [DONE]\n\n".
std::string render_done();
/// An error as an SSE event (after a stream started) — {"error": {...}}.
std::string render_error_event(const api_error& e);

/// {"error": {...}} body.
std::string render_error(const api_error& e);
/// GET /v1/models body listing `model_ids` (owned_by "weft").
std::string render_models(const std::vector<std::string>& model_ids, int64_t created);
/// GET /v1/models/{id} body: one model object (with its context length as max_model_len).
std::string render_model(const std::string& model_id, int64_t created, int64_t max_model_len);

/// An HTTP answer computed without the cluster (status and JSON body).
struct http_reply {
  int status = 200;
  std::string body;
};

/// POST /tokenize, in llama-server's form ({"content": TEXT, "add_special": bool,
/// "with_pieces": bool}) and vLLM's ({"prompt": TEXT, "add_special_tokens": bool} or
/// {"messages": [...], "add_generation_prompt": bool}, rendered with the chat template). Answers
/// {"tokens": [...], "count": N, "max_model_len": M}; with_pieces: tokens as {"id", "piece"}.
/// Special tokens written in the text are parsed as such for messages (as generation does) and
/// with "parse_special": true. `tmpl` may be null (then messages are a 400).
http_reply tokenize_request(std::string_view body, const gpu::tokenizer& tok,
                            const gpu::chat_template* tmpl, int64_t max_model_len);
/// POST /detokenize {"tokens": [ids]} -> {"content": TEXT, "prompt": TEXT} (llama-server's and
/// vLLM's field names); an id outside the vocabulary is a 400 naming it.
http_reply detokenize_request(std::string_view body, const gpu::tokenizer& tok);

}  // namespace weft::serve
