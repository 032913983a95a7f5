#pragma once
/// The HTTP front of `weft serve`: an OpenAI-compatible server (cpp-httplib) plus the api actor
/// that talks to the router. Each HTTP request runs on a server thread: it validates and tokenizes
/// the body, submits one sequence per choice through the api actor, and turns the token chunks the
/// router streams back into OpenAI responses or SSE events (text assembled here, from tokens, so a
/// migrated request keeps one consistent text). A client that disconnects aborts its sequences,
/// which frees their KV blocks on the worker.
///
/// Endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health (200
/// only while some worker reports and makes progress), GET /metrics (Prometheus), GET
/// /admin/cluster (nodes and workers, JSON).

#include <caf/fwd.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/serve/metrics.hpp"
#include "actors/serve/model_host.hpp"
#include "actors/serve/openai_api.hpp"

namespace weft::serve {

struct api_config {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;           ///< 0 = any free port (see api_server::port())
  std::string api_key;            ///< when set, /v1/* requires "Authorization: Bearer <key>"
  std::string served_model_name;  ///< model id clients use (default: the GGUF file name)
  /// Browser origins allowed to call the API (CORS), e.g. "http://localhost:3000"; "*" allows
  /// any. Empty: no CORS headers (browsers then refuse cross-origin calls).
  std::vector<std::string> allowed_origins;
  /// Context per sequence (prompt + completion); 0: the model's. Longer requests get 400
  /// context_length_exceeded, and chat's default max_tokens fills up to it.
  int64_t ctx_size = 0;
  int http_threads = 128;  ///< concurrent HTTP requests (streams hold one each)
  /// Connections that may wait for a free HTTP thread; beyond them a connection is answered 503
  /// (with Retry-After) by one overflow thread, so the wait queue never grows without bound.
  int http_queue = 256;
  uint32_t request_timeout_ms = 600'000;
  api_limits limits;
  /// /v1/embeddings: how the prompt's final hidden states are pooled (mean or last token).
  gpu::pooling_type pooling = gpu::pooling_type::mean;
  /// Extra JSON for GET /admin/cluster (the head's node table); may be empty.
  std::function<std::string()> cluster_json;
};

class api_server {
 public:
  /// Spawns the api actor, binds the HTTP port and starts serving on background threads.
  /// `tokenizer_host` (tokenizer + chat template) must outlive the server.
  static result<std::unique_ptr<api_server>> start(caf::actor_system& sys, caf::actor router,
                                                   const model_host& tokenizer_host,
                                                   api_config config,
                                                   std::shared_ptr<metrics_registry> metrics);
  ~api_server();
  api_server(const api_server&) = delete;
  api_server& operator=(const api_server&) = delete;

  uint16_t port() const;
  /// Stops accepting, ends open streams with an error event, joins the HTTP threads.
  void stop();

  struct impl;

 private:
  explicit api_server(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace weft::serve
