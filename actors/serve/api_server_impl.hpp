#pragma once
// Private to the api server's two translation units: api_server.cpp (the api actor, routes,
// lifecycle, submitting to the router) and api_server_generate.cpp (the request flow of the
// generation and embedding endpoints, CAF-free but for the actor handles it holds).

#include <httplib.h>
#include <caf/actor.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "actors/serve/api_server.hpp"
#include "actors/serve/stream_hub.hpp"

namespace weft::serve {

namespace api_internal {

using clock_type = std::chrono::steady_clock;

/// The HTTP status of an error code, and the OpenAI-shaped error body of an error.
int http_status_for(errc code);
api_error api_error_for(const error& e);
std::vector<uint8_t> bytes_of(const std::string& s);

/// Everything one choice accumulates.
struct choice_state {
  int index = 0;
  uint64_t seq_id = 0;
  int prompt_index = 0;
  std::unique_ptr<gpu::detokenizer_stream> detok;
  std::string full;           ///< text so far (assembled from tokens)
  size_t emitted = 0;         ///< bytes of `full` already handed to the client
  std::string pending_delta;  ///< text released but not yet written (non-streaming: everything)
  std::unique_ptr<tool_call_parser> tools;  ///< chat with tools: splits the text into calls
  std::vector<tool_call> pending_calls;     ///< calls parsed but not yet written
  std::vector<logprob_entry> pending_lps;
  int64_t n_tokens = 0;
  uint32_t prompt_tokens = 0;
  uint32_t cached_tokens = 0;
  bool done = false;
  bool first_sent = false;
  bool final_sent = false;
  std::string finish_reason;
  std::vector<float> embedding;  ///< /v1/embeddings: the pooled vector
  error err;
  std::optional<clock_type::time_point> first_token_at, last_token_at;
};

}  // namespace api_internal

struct api_server::impl {
  using clock_type = api_internal::clock_type;
  using choice_state = api_internal::choice_state;

  caf::actor_system* sys = nullptr;
  caf::actor router;
  caf::actor api;
  const model_host* host = nullptr;
  api_config cfg;
  std::shared_ptr<metrics_registry> metrics;
  std::shared_ptr<stream_hub> hub = std::make_shared<stream_hub>();
  httplib::Server http;
  std::thread http_thread;
  uint16_t bound_port = 0;
  std::atomic<uint64_t> next_seq{1};
  std::atomic<uint64_t> next_response{1};
  std::atomic<bool> stopping{false};
  std::vector<int32_t> eog;

  void declare_metrics();
  void routes();
  bool authorized(const httplib::Request& req, httplib::Response& res);
  /// Tokens per sequence: --ctx-size, else the model's context (2048 when the file names none).
  int64_t context_length() const {
    return cfg.ctx_size > 0 ? cfg.ctx_size : host->n_ctx > 0 ? host->n_ctx : 2048;
  }
  /// CORS for the origins in cfg.allowed_origins (none: no CORS headers at all).
  void cors();
  void send_error(httplib::Response& res, const api_error& e);
  /// One generation request on its way through the api: what it asked for, its sequences (one
  /// per prompt and choice) and the channel their tokens arrive on.
  struct generation {
    endpoint kind = endpoint::completions;
    clock_type::time_point start, deadline;
    std::shared_ptr<openai_request> r;
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::string> prompt_texts;
    std::vector<int32_t> max_tokens;  ///< per prompt, after the context check
    std::shared_ptr<stream_channel> channel = std::make_shared<stream_channel>();
    std::shared_ptr<std::vector<choice_state>> choices =
        std::make_shared<std::vector<choice_state>>();
    std::string trace;
    response_meta meta;

    bool all_done() const;
    usage_info usage() const;
  };
  /// Ids of choice `index`'s tool calls: "call_<response id>_<choice>_<call>".
  static std::string tool_call_id_prefix(const generation& g, int index) {
    const auto dash = g.meta.id.find('-');
    return "call_" + (dash == std::string::npos ? g.meta.id : g.meta.id.substr(dash + 1)) + "_" +
           std::to_string(index) + "_";
  }

  /// POST /v1/completions and /v1/chat/completions, in named steps: prepare (parse, tokenize,
  /// fit the context), submit (one sequence per prompt and choice), admit (every sequence
  /// accepted by the router), then respond (SSE stream or one JSON body).
  void handle_generate(endpoint kind, const httplib::Request& req, httplib::Response& res);
  /// POST /v1/embeddings: one sequence per input, pooled by the workers, answered in one body.
  void handle_embeddings(const httplib::Request& req, httplib::Response& res);
  std::shared_ptr<generation> prepare(endpoint kind, const httplib::Request& req,
                                      httplib::Response& res, clock_type::time_point start);
  bool tokenize_prompts(generation& g, httplib::Response& res);
  bool fit_context(generation& g, httplib::Response& res);
  void submit(generation& g);
  bool admit(generation& g, httplib::Response& res);
  void respond_streaming(const std::shared_ptr<generation>& g, httplib::Response& res);
  void respond_json(const std::shared_ptr<generation>& g, httplib::Response& res);
  void abort_all(generation& g, const std::string& why);
  std::optional<std::string> router_status(uint32_t timeout_ms);
  void abort_seq(uint64_t id, const std::string& why);
  void absorb(const openai_request& r, choice_state& c, choice_event& e);
  void finish_metrics(endpoint kind, const std::vector<choice_state>& choices,
                      clock_type::time_point start, const std::string& status);
};

}  // namespace weft::serve
