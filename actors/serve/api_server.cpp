// The OpenAI-compatible HTTP front of `weft serve` and the api actor between it and the router.

#include "actors/serve/api_server.hpp"
#include "actors/serve/chat_page.hpp"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>

#include "actors/auth.hpp"
#include "actors/serve/http_queue.hpp"
#include "actors/serve/openai_embeddings.hpp"
#include "actors/serve/serve_atoms.hpp"
#include "actors/serve/stream_hub.hpp"
#include "actors/serve/wire_convert.hpp"
#include "schema/caf_bridge.hpp"

namespace weft::serve {

using schema::envelope;
namespace wire = schema::wire;
using clock_type = std::chrono::steady_clock;

namespace {

// -- the api actor --------------------------------------------------------------------------------

struct api_actor_state {
  static inline const char* name = "weft.api";
};

caf::behavior api_actor(caf::stateful_actor<api_actor_state>* self, caf::actor router,
                        std::shared_ptr<stream_hub> hub) {
  self->monitor(router);
  return {
      [self, router, hub](submit_atom, uint64_t id, const envelope& env) {
        // The router lives in this process; a reply that takes this long means it is wedged.
        self->request(router, std::chrono::seconds(30), submit_atom::value, env)
            .then(
                [hub, id](const envelope& reply) {
                  choice_event e;
                  e.ack = true;
                  e.err = schema::error_from(reply);
                  hub->deliver(id, std::move(e));
                },
                [hub, id](caf::error& err) {
                  choice_event e;
                  e.ack = true;
                  e.err =
                      make_error(errc::unavailable, "router unavailable: " + caf::to_string(err));
                  hub->deliver(id, std::move(e));
                });
      },
      [hub](chunk_atom, const envelope& env) {
        auto c = env.read<wire::TokenChunk>();
        if (!c) {
          spdlog::warn("api: malformed TokenChunk: {}", c.error().to_string());
          return;
        }
        auto chunk = c->get();
        choice_event e;
        for (int32_t t : chunk.getTokens()) e.tokens.push_back(t);
        for (auto lp : chunk.getLogprobs()) {
          gpu::sample_result s;
          s.token = lp.getToken();
          s.logprob = lp.getLogprob();
          for (auto t : lp.getTop()) s.top.push_back({t.getToken(), t.getLogprob()});
          e.logprobs.push_back(std::move(s));
        }
        e.finish = chunk.getFinish();
        for (float x : chunk.getEmbedding()) e.embedding.push_back(x);
        e.prompt_tokens = chunk.getPromptTokens();
        e.cached_tokens = chunk.getCachedTokens();
        if (chunk.hasError()) {
          e.err = make_error(schema::from_wire(chunk.getError().getCode()),
                             chunk.getError().getMessage().cStr());
          if (e.err.ok()) e.err = make_error(errc::internal, "generation failed");
        }
        hub->deliver(chunk.getRequestId(), std::move(e));
      },
  };
}

// -- helpers
// ----------------------------------------------------------------------------------------

int http_status_for(errc code) {
  switch (code) {
    case errc::overloaded:
      return 429;
    case errc::unavailable:
      return 503;
    case errc::timeout:
      return 504;
    case errc::invalid_argument:
    case errc::malformed:
      return 400;
    case errc::not_found:
      return 404;
    case errc::unauthorized:
      return 401;
    default:
      return 500;
  }
}

api_error api_error_for(const error& e) {
  api_error a;
  a.http_status = http_status_for(e.code);
  a.type = a.http_status == 429   ? "rate_limit_error"
           : a.http_status >= 500 ? "server_error"
                                  : "invalid_request_error";
  a.message = e.message;
  if (e.code == errc::overloaded) a.code = "rate_limit_exceeded";
  return a;
}

std::vector<uint8_t> bytes_of(const std::string& s) {
  return {s.begin(), s.end()};
}

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

}  // namespace

// -- the server
// -------------------------------------------------------------------------------------

struct api_server::impl {
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

void api_server::impl::declare_metrics() {
  if (!metrics) return;
  metrics->declare_counter("weft_http_requests_total", "HTTP requests by endpoint and status code",
                           {});
  metrics->declare_counter(
      "weft_requests_total", "Generation requests by endpoint and outcome", [] {
        std::vector<metric_labels> zero;
        for (const char* ep : {"completions", "chat_completions", "embeddings"}) {
          for (const char* o : {"ok", "error", "disconnected"}) {
            zero.push_back({{"endpoint", ep}, {"outcome", o}});
          }
        }
        return zero;
      }());
  metrics->declare_counter("weft_prompt_tokens_total", "Prompt tokens of finished sequences");
  metrics->declare_counter("weft_cached_prompt_tokens_total",
                           "Prompt tokens served from a prefix cache");
  metrics->declare_counter("weft_generation_tokens_total",
                           "Tokens generated and delivered to clients");
  metrics->declare_counter("weft_client_disconnects_total",
                           "Requests aborted because the client went away");
  metrics->declare_counter("weft_http_overflow_total",
                           "HTTP requests answered 503 because the wait queue was full");
  metrics->declare_gauge("weft_requests_in_flight", "HTTP generation requests being served");
  const auto buckets = metrics_registry::latency_buckets_s();
  metrics->declare_histogram("weft_ttft_seconds", "Time to first token, per sequence", buckets);
  metrics->declare_histogram("weft_tpot_seconds",
                             "Time per output token after the first, per sequence", buckets);
  metrics->declare_histogram("weft_e2e_seconds", "Request latency, end to end", buckets);
}

bool api_server::impl::authorized(const httplib::Request& req, httplib::Response& res) {
  if (cfg.api_key.empty()) return true;
  const auto h = req.get_header_value("Authorization");
  // Compare MACs under a per-process random key: the time taken does not depend on how much of
  // the key a guess got right, nor on its length.
  static const actors::cluster_secret compare_key{[] {
    auto b = actors::random_bytes(32);
    return std::string(b.begin(), b.end());
  }()};
  if (actors::macs_equal(actors::hmac_sha256(compare_key, h),
                         actors::hmac_sha256(compare_key, "Bearer " + cfg.api_key).data(), 32)) {
    return true;
  }
  api_error e;
  e.http_status = 401;
  e.type = "authentication_error";
  e.code = "invalid_api_key";
  e.message =
      h.empty() ? "missing API key: send 'Authorization: Bearer <key>'" : "incorrect API key";
  send_error(res, e);
  return false;
}

void api_server::impl::send_error(httplib::Response& res, const api_error& e) {
  res.status = e.http_status;
  res.set_content(render_error(e), "application/json");
}

std::optional<std::string> api_server::impl::router_status(uint32_t timeout_ms) {
  caf::scoped_actor s{*sys};
  std::optional<std::string> out;
  s->request(router, std::chrono::milliseconds(timeout_ms), status_atom::value)
      .receive([&](const std::string& json) { out = json; }, [&](caf::error&) {});
  return out;
}

void api_server::impl::abort_seq(uint64_t id, const std::string& why) {
  hub->remove(id);
  caf::anon_send(router, abort_atom::value,
                 envelope::build<wire::AbortRequest>([&](wire::AbortRequest::Builder b) {
                   b.setRequestId(id);
                   b.setReason(why);
                 }));
}

// Folds a chunk into a choice: text from tokens, stop strings (authoritative here: a migrated
// sequence's worker only sees text from its resume point), log-probabilities, finish.
void api_server::impl::absorb(const openai_request& r, choice_state& c, choice_event& e) {
  const auto now = clock_type::now();
  const auto& stops = r.sampling.stop_strings;
  if (!e.tokens.empty()) {
    if (!c.first_token_at) c.first_token_at = now;
    c.last_token_at = now;
  }
  c.prompt_tokens = std::max(c.prompt_tokens, e.prompt_tokens);
  c.cached_tokens = std::max(c.cached_tokens, e.cached_tokens);
  if (!e.embedding.empty()) c.embedding = std::move(e.embedding);
  size_t lp_index = 0;
  for (int32_t t : e.tokens) {
    if (c.done) break;
    ++c.n_tokens;
    c.full += c.detok->push(t);
    if (r.want_logprobs && lp_index < e.logprobs.size()) {
      const auto& s = e.logprobs[lp_index];
      logprob_entry le;
      le.token = host->tok.token_to_piece(s.token);
      le.logprob = s.logprob;
      le.bytes = bytes_of(le.token);
      for (const auto& a : s.top) {
        const std::string piece = host->tok.token_to_piece(a.token);
        le.top.push_back({piece, a.logprob, bytes_of(piece)});
      }
      c.pending_lps.push_back(std::move(le));
    }
    ++lp_index;
    // A stop string ends the choice; the text is cut before it.
    for (const auto& s : stops) {
      const size_t from = c.emitted >= s.size() ? c.emitted - s.size() + 1 : 0;
      const size_t pos = c.full.find(s, from);
      if (pos != std::string::npos && pos >= c.emitted) {
        c.full.resize(pos);
        c.done = true;
        c.finish_reason = "stop";
      }
    }
  }
  const bool engine_finished = e.finish != wire::FinishReason::NONE;
  if (!c.done && engine_finished) {
    c.done = true;
    switch (e.finish) {
      case wire::FinishReason::STOP_TOKEN:
      case wire::FinishReason::STOP_STRING:
        c.finish_reason = "stop";
        break;
      case wire::FinishReason::LENGTH:
        c.finish_reason = "length";
        break;
      case wire::FinishReason::ABORTED:
        c.finish_reason = "abort";
        break;
      default:
        c.finish_reason = "error";
        c.err = e.err.ok() ? make_error(errc::internal, "generation failed") : e.err;
        break;
    }
    if (c.finish_reason != "error") c.full += c.detok->finish();
  } else if (c.done && !engine_finished) {
    abort_seq(c.seq_id, "stop string");
  }
  // Release text, holding back what could be the start of a stop string (or is the stop string).
  size_t release_to = c.full.size();
  if (!c.done) {
    for (const auto& s : stops) {
      for (size_t k = std::min(s.size() - 1, c.full.size() - c.emitted); k > 0; --k) {
        if (c.full.compare(c.full.size() - k, k, s, 0, k) == 0) {
          release_to = std::min(release_to, c.full.size() - k);
          break;
        }
      }
    }
  }
  if (release_to > c.emitted) {
    const std::string_view piece =
        std::string_view(c.full).substr(c.emitted, release_to - c.emitted);
    if (c.tools) {
      auto o = c.tools->feed(piece);
      c.pending_delta += o.content;
      for (auto& call : o.calls) c.pending_calls.push_back(std::move(call));
    } else {
      c.pending_delta += piece;
    }
    c.emitted = release_to;
  }
  if (c.done && c.tools) {
    auto o = c.tools->finish();
    c.pending_delta += o.content;
    for (auto& call : o.calls) c.pending_calls.push_back(std::move(call));
    if (c.tools->calls() > 0 && c.finish_reason == "stop") c.finish_reason = "tool_calls";
  }
  if (c.done) hub->remove(c.seq_id);
}

void api_server::impl::finish_metrics(endpoint kind, const std::vector<choice_state>& choices,
                                      clock_type::time_point start, const std::string& status) {
  if (!metrics) return;
  const std::string ep = kind == endpoint::completions        ? "completions"
                         : kind == endpoint::chat_completions ? "chat_completions"
                                                              : "embeddings";
  metrics->inc("weft_requests_total", {{"endpoint", ep}, {"outcome", status}});
  metrics->observe("weft_e2e_seconds",
                   std::chrono::duration<double>(clock_type::now() - start).count());
  for (const auto& c : choices) {
    metrics->inc("weft_generation_tokens_total", {}, static_cast<double>(c.n_tokens));
    metrics->inc("weft_prompt_tokens_total", {}, c.prompt_tokens);
    metrics->inc("weft_cached_prompt_tokens_total", {}, c.cached_tokens);
    if (c.first_token_at) {
      metrics->observe("weft_ttft_seconds",
                       std::chrono::duration<double>(*c.first_token_at - start).count());
      if (c.n_tokens > 1 && c.last_token_at) {
        metrics->observe(
            "weft_tpot_seconds",
            std::chrono::duration<double>(*c.last_token_at - *c.first_token_at).count() /
                static_cast<double>(c.n_tokens - 1));
      }
    }
  }
}

void api_server::impl::handle_generate(endpoint kind, const httplib::Request& req,
                                       httplib::Response& res) {
  const auto start = clock_type::now();
  if (!authorized(req, res)) return;
  auto g = prepare(kind, req, res, start);
  if (!g) return;  // refused with a 4xx
  submit(*g);
  if (!admit(*g, res)) return;
  if (g->r->stream) {
    respond_streaming(g, res);
  } else {
    respond_json(g, res);
  }
}

void api_server::impl::handle_embeddings(const httplib::Request& req, httplib::Response& res) {
  const auto start = clock_type::now();
  if (!authorized(req, res)) return;
  embeddings_limits lim;
  lim.max_tokens = context_length();
  lim.n_embd = host->n_embd;
  auto parsed = parse_embeddings_request(req.body, host->tok, lim);
  if (!parsed.request) {
    send_error(res, parsed.error);
    return;
  }
  const auto& er = *parsed.request;
  if (!er.model.empty() && er.model != cfg.served_model_name) {
    send_error(res, api_error{404, "invalid_request_error",
                              "The model '" + er.model + "' does not exist; this server serves '" +
                                  cfg.served_model_name + "'",
                              "model", "model_not_found"});
    return;
  }
  // One sequence per input through the same path as generation (router, workers, migration):
  // the workers pool the prompt's final hidden states and finish without sampling.
  auto g = std::make_shared<generation>();
  g->kind = endpoint::embeddings;
  g->start = start;
  g->deadline = start + std::chrono::milliseconds(cfg.request_timeout_ms);
  g->r = std::make_shared<openai_request>();
  g->r->kind = endpoint::embeddings;
  g->r->sampling.pooling = cfg.pooling;
  g->r->ignore_eos = true;
  g->prompts = er.inputs;
  g->max_tokens.assign(g->prompts.size(), 1);
  g->trace = "embd-" + std::to_string(actors::now_ms()) + "-" + std::to_string(next_response++);
  submit(*g);
  if (!admit(*g, res)) return;
  while (!g->all_done()) {
    auto e = g->channel->pop(std::chrono::milliseconds(200));
    if (e) {
      if (!e->ack) absorb(*g->r, (*g->choices)[static_cast<size_t>(e->choice)], *e);
      continue;
    }
    if (clock_type::now() > g->deadline || stopping) {
      abort_all(*g, "timeout");
      finish_metrics(g->kind, *g->choices, start, "error");
      send_error(res, api_error_for(make_error(errc::timeout, "request timed out")));
      return;
    }
  }
  std::vector<std::vector<float>> vecs;
  int64_t prompt_tokens = 0;
  for (auto& c : *g->choices) {
    const bool failed = c.finish_reason == "error" || c.embedding.empty();
    if (failed) {
      abort_all(*g, "error");
      finish_metrics(g->kind, *g->choices, start, "error");
      send_error(res, api_error_for(c.err.ok() ? make_error(errc::internal,
                                                            "input " + std::to_string(c.index) +
                                                                " returned no embedding")
                                               : c.err));
      return;
    }
    if (er.normalize) l2_normalize(c.embedding);
    vecs.push_back(std::move(c.embedding));
    prompt_tokens += c.prompt_tokens;
  }
  finish_metrics(g->kind, *g->choices, start, "ok");
  res.set_content(render_embeddings(cfg.served_model_name, vecs, er.base64, prompt_tokens),
                  "application/json");
}

bool api_server::impl::generation::all_done() const {
  for (const auto& c : *choices) {
    if (!c.done) return false;
  }
  return true;
}

usage_info api_server::impl::generation::usage() const {
  usage_info u;
  std::vector<uint32_t> cached(prompts.size(), 0);
  for (const auto& c : *choices) {
    u.completion_tokens += c.n_tokens;
    if (c.index % r->n == 0) u.prompt_tokens += c.prompt_tokens;
    cached[static_cast<size_t>(c.prompt_index)] =
        std::max(cached[static_cast<size_t>(c.prompt_index)], c.cached_tokens);
  }
  for (auto x : cached) u.cached_tokens += x;
  return u;
}

void api_server::impl::abort_all(generation& g, const std::string& why) {
  for (auto& c : *g.choices) {
    if (!c.done) abort_seq(c.seq_id, why);
    hub->remove(c.seq_id);
  }
}

std::shared_ptr<api_server::impl::generation> api_server::impl::prepare(
    endpoint kind, const httplib::Request& req, httplib::Response& res,
    clock_type::time_point start) {
  auto parsed = parse_request(kind, req.body, cfg.limits);
  if (!parsed.request) {
    send_error(res, parsed.error);
    return nullptr;
  }
  auto g = std::make_shared<generation>();
  g->kind = kind;
  g->start = start;
  g->deadline = start + std::chrono::milliseconds(cfg.request_timeout_ms);
  g->r = std::make_shared<openai_request>(std::move(*parsed.request));
  const auto& r = g->r;
  if (!r->model.empty() && r->model != cfg.served_model_name) {
    send_error(res, api_error{404, "invalid_request_error",
                              "The model '" + r->model + "' does not exist; this server serves '" +
                                  cfg.served_model_name + "'",
                              "model", "model_not_found"});
    return nullptr;
  }
  if (!tokenize_prompts(*g, res)) return nullptr;
  if (!fit_context(*g, res)) return nullptr;
  g->trace = (kind == endpoint::completions ? "cmpl-" : "chatcmpl-") +
             std::to_string(actors::now_ms()) + "-" + std::to_string(next_response++);
  g->meta.id = g->trace;
  g->meta.created = static_cast<int64_t>(actors::now_ms() / 1000);
  g->meta.model = cfg.served_model_name;
  return g;
}

bool api_server::impl::tokenize_prompts(generation& g, httplib::Response& res) {
  const auto& r = g.r;
  auto& prompts = g.prompts;
  auto& prompt_texts = g.prompt_texts;
  const auto n_vocab = static_cast<int32_t>(host->tok.n_vocab());
  if (g.kind == endpoint::chat_completions) {
    if (!host->tmpl) {
      send_error(res,
                 api_error{400, "invalid_request_error",
                           "this model has no chat template; use /v1/completions", "messages", ""});
      return false;
    }
    auto text = render_chat_prompt(*host->tmpl, *r, gpu::generation_prompt::add);
    if (!text) {
      send_error(res,
                 api_error{400, "invalid_request_error", text.error().to_string(), "messages", ""});
      return false;
    }
    prompts.push_back(host->tok.encode(*text, gpu::add_special::yes, gpu::parse_special::yes));
    prompt_texts.push_back(*text);
    return true;
  }
  for (const auto& p : r->prompts) {
    prompts.push_back(host->tok.encode(p, gpu::add_special::yes, gpu::parse_special::no));
    prompt_texts.push_back(p);
  }
  for (const auto& ids : r->prompt_token_ids) {
    for (int32_t t : ids) {
      if (t < 0 || t >= n_vocab) {
        send_error(
            res, api_error{400, "invalid_request_error",
                           "prompt token " + std::to_string(t) + " is outside the vocabulary (0.." +
                               std::to_string(n_vocab - 1) + ")",
                           "prompt", ""});
        return false;
      }
    }
    prompts.push_back(ids);
    prompt_texts.push_back(host->tok.decode(ids));
  }
  return true;
}

bool api_server::impl::fit_context(generation& g, httplib::Response& res) {
  const auto& r = g.r;
  const auto kind = g.kind;
  const auto& prompts = g.prompts;
  auto& max_tokens = g.max_tokens;
  const int64_t n_ctx = context_length();
  max_tokens.assign(prompts.size(), 0);
  for (size_t p = 0; p < prompts.size(); ++p) {
    const auto len = static_cast<int64_t>(prompts[p].size());
    if (len == 0) {
      send_error(res, api_error{400, "invalid_request_error", "the prompt is empty", "prompt", ""});
      return false;
    }
    int64_t mt = r->sampling.max_tokens;
    if (mt < 0) mt = kind == endpoint::completions ? 16 : n_ctx - len;
    if (len + mt > n_ctx || mt < 1) {
      send_error(res, api_error{400, "invalid_request_error",
                                "This model's maximum context length is " + std::to_string(n_ctx) +
                                    " tokens. However, you requested " +
                                    std::to_string(len + std::max<int64_t>(mt, 1)) + " tokens (" +
                                    std::to_string(len) + " in the prompt, " +
                                    std::to_string(std::max<int64_t>(mt, 1)) +
                                    " for the completion). Please reduce the prompt or max_tokens.",
                                kind == endpoint::chat_completions ? "messages" : "prompt",
                                "context_length_exceeded"});
      return false;
    }
    max_tokens[p] = static_cast<int32_t>(mt);
  }

  return true;
}

void api_server::impl::submit(generation& g) {
  const auto& r = g.r;
  auto& choices = g.choices;
  std::random_device rd;
  for (size_t p = 0; p < g.prompts.size(); ++p) {
    for (int i = 0; i < r->n; ++i) {
      choice_state c;
      c.index = static_cast<int>(choices->size());
      c.prompt_index = static_cast<int>(p);
      c.seq_id = next_seq++;
      c.detok = std::make_unique<gpu::detokenizer_stream>(host->tok);
      if (g.kind == endpoint::chat_completions && r->tools.active()) {
        c.tools = std::make_unique<tool_call_parser>(r->tools, tool_call_id_prefix(g, c.index));
      }
      c.prompt_tokens = static_cast<uint32_t>(g.prompts[p].size());
      choices->push_back(std::move(c));
    }
  }
  for (auto& c : *choices) {
    generate_spec spec;
    spec.request_id = c.seq_id;
    spec.trace_id = g.trace;
    spec.prompt = g.prompts[static_cast<size_t>(c.prompt_index)];
    spec.params = r->sampling;
    spec.params.max_tokens = g.max_tokens[static_cast<size_t>(c.prompt_index)];
    const int within = c.index % r->n;
    spec.params.seed = r->has_seed ? r->sampling.seed + static_cast<uint64_t>(within)
                                   : (static_cast<uint64_t>(rd()) << 32) ^ rd();
    if (!r->ignore_eos) spec.params.stop_tokens = eog;
    spec.params.n_logprobs = r->want_logprobs ? r->top_logprobs : 0;
    spec.want_logprobs = r->want_logprobs;
    spec.deadline_ms = actors::now_ms() + cfg.request_timeout_ms;
    hub->add(c.seq_id, g.channel, c.index);
    caf::anon_send(api, submit_atom::value, c.seq_id, to_wire(spec));
  }
  if (metrics) metrics->set("weft_requests_in_flight", static_cast<double>(hub->size()));
}

bool api_server::impl::admit(generation& g, httplib::Response& res) {
  // Every choice must be accepted by the router.
  size_t acks = 0;
  std::deque<choice_event> early;  // chunks that overtook an ack
  while (acks < g.choices->size()) {
    auto e = g.channel->pop(std::chrono::milliseconds(200));
    if (!e) {
      if (clock_type::now() > g.deadline || stopping) {
        abort_all(g, "timeout");
        send_error(res, api_error_for(
                            make_error(errc::timeout, "request timed out waiting for admission")));
        return false;
      }
      continue;
    }
    if (!e->ack) {
      early.push_back(std::move(*e));
      continue;
    }
    ++acks;
    if (!e->err.ok()) {
      (*g.choices)[static_cast<size_t>(e->choice)].done = true;
      abort_all(g, "admission refused");
      finish_metrics(g.kind, *g.choices, g.start, "rejected");
      send_error(res, api_error_for(e->err));
      return false;
    }
  }
  for (auto& e : early) absorb(*g.r, (*g.choices)[static_cast<size_t>(e.choice)], e);
  return true;
}

void api_server::impl::respond_streaming(const std::shared_ptr<generation>& g,
                                         httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [this, g](size_t, httplib::DataSink& sink) {
    const auto& r = g->r;
    const auto kind = g->kind;
    auto& choices = g->choices;
    const auto& meta = g->meta;
    auto& channel = g->channel;
    const auto start = g->start;
    const auto deadline = g->deadline;
    const bool with_lp = r->want_logprobs;
    auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
    while (true) {
      for (auto& c : *choices) {
        const bool news = !c.pending_delta.empty() || !c.pending_lps.empty() ||
                          !c.pending_calls.empty() || (c.done && !c.final_sent);
        if (!news) continue;
        bool ok = true;
        if (c.done && !c.final_sent && !c.err.ok()) {
          ok = write(render_error_event(api_error_for(c.err)));
        } else {
          choice_result d;
          d.index = c.index;
          d.text = std::move(c.pending_delta);
          d.logprobs = std::move(c.pending_lps);
          d.tool_calls = std::move(c.pending_calls);
          d.finish_reason = c.done ? c.finish_reason : "";
          ok = write(render_chunk(kind, meta, d, !c.first_sent, with_lp, r->include_usage));
          c.first_sent = true;
        }
        c.pending_delta.clear();
        c.pending_lps.clear();
        c.pending_calls.clear();
        if (c.done) c.final_sent = true;
        if (!ok) {
          if (metrics) metrics->inc("weft_client_disconnects_total");
          abort_all(*g, "client disconnected");
          finish_metrics(kind, *choices, start, "disconnected");
          return false;
        }
      }
      if (g->all_done()) break;
      auto e = channel->pop(std::chrono::milliseconds(500));
      if (!e) {
        if (clock_type::now() > deadline || stopping) {
          abort_all(*g, "timeout");
          write(render_error_event(api_error_for(make_error(errc::timeout, "request timed out"))));
          break;
        }
        // Probe the connection: an SSE comment line is ignored by clients.
        if (!write(": keep-alive\n\n")) {
          if (metrics) metrics->inc("weft_client_disconnects_total");
          abort_all(*g, "client disconnected");
          finish_metrics(kind, *choices, start, "disconnected");
          return false;
        }
        continue;
      }
      if (e->ack) continue;
      absorb(*r, (*choices)[static_cast<size_t>(e->choice)], *e);
    }
    if (r->include_usage) write(render_usage_chunk(kind, meta, g->usage()));
    write(render_done());
    finish_metrics(kind, *choices, start, "ok");
    sink.done();
    return true;
  });
}

void api_server::impl::respond_json(const std::shared_ptr<generation>& g, httplib::Response& res) {
  const auto& r = g->r;
  const auto kind = g->kind;
  auto& choices = g->choices;
  auto& channel = g->channel;
  const auto start = g->start;
  const auto deadline = g->deadline;
  // Non-streaming: wait until every choice has its first token or finished, so that errors found
  // before then get a proper status code; then stream the (whitespace-padded) JSON body, which lets
  // a disconnect be noticed while generation continues.
  auto wait_event = [&](std::chrono::milliseconds t) -> bool {
    auto e = channel->pop(t);
    if (!e) return false;
    if (!e->ack) absorb(*r, (*choices)[static_cast<size_t>(e->choice)], *e);
    return true;
  };
  auto started = [&] {
    for (const auto& c : *choices) {
      if (!c.done && !c.first_token_at) return false;
    }
    return true;
  };
  while (!started()) {
    if (!wait_event(std::chrono::milliseconds(200)) && (clock_type::now() > deadline || stopping)) {
      abort_all(*g, "timeout");
      send_error(res, api_error_for(make_error(errc::timeout, "request timed out")));
      return;
    }
  }
  for (const auto& c : *choices) {
    if (c.finish_reason == "error") {
      abort_all(*g, "error");
      finish_metrics(kind, *choices, start, "error");
      send_error(res, api_error_for(c.err));
      return;
    }
  }
  auto render_final = [g] {
    const auto& r = g->r;
    const auto kind = g->kind;
    auto& choices = g->choices;
    std::vector<choice_result> out;
    for (auto& c : *choices) {
      choice_result cr;
      cr.index = c.index;
      cr.text = c.full;
      if (r->echo && kind == endpoint::completions)
        cr.text = g->prompt_texts[static_cast<size_t>(c.prompt_index)] + cr.text;
      cr.logprobs = std::move(c.pending_lps);
      cr.finish_reason = c.finish_reason;
      if (c.tools) {
        // The same split the stream would have shown (the same parser over the whole text).
        auto o = parse_tool_output(c.full, r->tools, tool_call_id_prefix(*g, c.index));
        cr.text = std::move(o.content);
        cr.tool_calls = std::move(o.calls);
      }
      out.push_back(std::move(cr));
    }
    return render_response(kind, g->meta, out, g->usage(), r->want_logprobs);
  };
  if (g->all_done()) {
    res.set_content(render_final(), "application/json");
    finish_metrics(kind, *choices, start, "ok");
    return;
  }
  res.set_chunked_content_provider(
      "application/json", [this, g, render_final](size_t, httplib::DataSink& sink) {
        const auto& r = g->r;
        const auto kind = g->kind;
        auto& choices = g->choices;
        auto& channel = g->channel;
        const auto start = g->start;
        const auto deadline = g->deadline;
        // JSON allows leading whitespace: a space every probe interval checks that the client is
        // still there, whether or not tokens are arriving (a closed peer fails the second write
        // after it hung up), so an abandoned request is aborted and its KV freed within ~0.5 s.
        constexpr auto probe_every = std::chrono::milliseconds(250);
        auto last_probe = clock_type::now();
        while (!g->all_done()) {
          auto e = channel->pop(probe_every);
          const auto now = clock_type::now();
          if (!e && (now > deadline || stopping)) {
            abort_all(*g, "timeout");
            const std::string body =
                render_error(api_error_for(make_error(errc::timeout, "request timed out")));
            sink.write(body.data(), body.size());
            sink.done();
            return true;
          }
          if (now - last_probe >= probe_every) {
            last_probe = now;
            if (!sink.write(" ", 1)) {
              if (metrics) metrics->inc("weft_client_disconnects_total");
              abort_all(*g, "client disconnected");
              finish_metrics(kind, *choices, start, "disconnected");
              return false;
            }
          }
          if (e && !e->ack) absorb(*r, (*choices)[static_cast<size_t>(e->choice)], *e);
        }
        std::string body;
        bool failed = false;
        for (const auto& c : *choices) {
          if (c.finish_reason == "error") {
            body = render_error(api_error_for(c.err));
            failed = true;
            break;
          }
        }
        if (!failed) body = render_final();
        sink.write(body.data(), body.size());
        finish_metrics(kind, *choices, start, failed ? "error" : "ok");
        sink.done();
        return true;
      });
}

void api_server::impl::cors() {
  if (cfg.allowed_origins.empty()) return;
  auto allowed = [this](const std::string& origin) -> std::string {
    for (const auto& o : cfg.allowed_origins) {
      if (o == "*") return "*";
      if (o == origin) return origin;
    }
    return {};
  };
  // Every answer to an allowed origin carries the header (streams included: the post-routing
  // handler runs before the headers are written).
  http.set_post_routing_handler([allowed](const httplib::Request& req, httplib::Response& res) {
    const auto origin = req.get_header_value("Origin");
    if (origin.empty()) return;
    const auto a = allowed(origin);
    if (a.empty()) return;
    res.set_header("Access-Control-Allow-Origin", a);
    if (a != "*") res.set_header("Vary", "Origin");
  });
  http.Options(R"(.*)", [this, allowed](const httplib::Request& req, httplib::Response& res) {
    const auto origin = req.get_header_value("Origin");
    if (allowed(origin).empty()) {
      send_error(res, api_error{403, "invalid_request_error",
                                "origin '" + origin + "' is not in --allowed-origins", "", ""});
      return;
    }
    res.status = 204;
    res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
    res.set_header("Access-Control-Max-Age", "600");
  });
}

void api_server::impl::routes() {
  http.new_task_queue = [n = cfg.http_threads, q = cfg.http_queue] {
    return new bounded_task_queue(static_cast<size_t>(std::max(1, n)),
                                  static_cast<size_t>(std::max(0, q)));
  };
  http.set_pre_routing_handler([this](const httplib::Request&, httplib::Response& res) {
    if (!bounded_task_queue::overloaded) return httplib::Server::HandlerResponse::Unhandled;
    if (metrics) metrics->inc("weft_http_overflow_total");
    res.set_header("Retry-After", "1");
    send_error(
        res, api_error{503, "server_error",
                       "the server is busy: every HTTP thread is taken and " +
                           std::to_string(cfg.http_queue) + " connections are waiting; retry later",
                       "", "server_busy"});
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_payload_max_length(cfg.limits.max_body_bytes);
  http.set_read_timeout(60, 0);
  http.set_write_timeout(60, 0);
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    if (metrics)
      metrics->inc("weft_http_requests_total",
                   {{"path", req.path}, {"code", std::to_string(res.status)}});
    spdlog::debug("http {} {} -> {}", req.method, req.path, res.status);
  });
  http.set_exception_handler(
      [this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "internal error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        spdlog::error("http handler failed: {}", what);
        send_error(res, api_error{500, "server_error", what, "", ""});
      });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(endpoint::completions, req, res);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(endpoint::chat_completions, req, res);
  });
  http.Post("/v1/embeddings", [this](const httplib::Request& req, httplib::Response& res) {
    handle_embeddings(req, res);
  });
  http.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    res.set_content(
        render_models({cfg.served_model_name}, static_cast<int64_t>(actors::now_ms() / 1000)),
        "application/json");
  });
  http.Get("/", [](const httplib::Request&, httplib::Response& res) {
    const auto page = chat_page_html();
    res.set_content(page.data(), page.size(), "text/html; charset=utf-8");
  });
  http.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    const std::string id = req.matches[1];
    if (id != cfg.served_model_name) {
      send_error(res, api_error{404, "invalid_request_error",
                                "the model '" + id + "' does not exist; this server serves '" +
                                    cfg.served_model_name + "'",
                                "model", "model_not_found"});
      return;
    }
    res.set_content(
        render_model(id, static_cast<int64_t>(actors::now_ms() / 1000), context_length()),
        "application/json");
  });
  http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    const auto r = tokenize_request(req.body, host->tok, host->tmpl ? &*host->tmpl : nullptr,
                                    context_length());
    res.status = r.status;
    res.set_content(r.body, "application/json");
  });
  http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    const auto r = detokenize_request(req.body, host->tok);
    res.status = r.status;
    res.set_content(r.body, "application/json");
  });
  cors();
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    auto st = router_status(2000);
    bool healthy = false;
    std::string detail = "router did not answer";
    if (st) {
      auto j = nlohmann::json::parse(*st, nullptr, false);
      healthy = !j.is_discarded() && j.value("healthy", false);
      detail = healthy ? "ok" : "no engine worker is reporting progress";
    }
    res.status = healthy ? 200 : 503;
    res.set_content(
        nlohmann::json{{"status", healthy ? "ok" : "unhealthy"}, {"detail", detail}}.dump(),
        "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    if (metrics) metrics->set("weft_requests_in_flight", static_cast<double>(hub->size()));
    res.set_content(metrics ? metrics->render() : std::string{}, "text/plain; version=0.0.4");
  });
  http.Get("/admin/cluster", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    nlohmann::json j;
    auto st = router_status(2000);
    j["router"] = st ? nlohmann::json::parse(*st, nullptr, false) : nlohmann::json(nullptr);
    if (cfg.cluster_json) j["cluster"] = nlohmann::json::parse(cfg.cluster_json(), nullptr, false);
    j["model"] = cfg.served_model_name;
    res.set_content(j.dump(2), "application/json");
  });
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    api_error e;
    e.http_status = res.status;
    e.type = res.status == 404 ? "not_found_error" : "invalid_request_error";
    e.message = res.status == 404   ? "no route " + req.method + " " + req.path
                : res.status == 413 ? "request body too large"
                                    : "bad request";
    if (res.status == 413) e.type = "invalid_request_error";
    res.set_content(render_error(e), "application/json");
  });
}

api_server::api_server(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

api_server::~api_server() {
  stop();
}

uint16_t api_server::port() const {
  return impl_->bound_port;
}

void api_server::stop() {
  if (!impl_ || impl_->stopping.exchange(true)) return;
  impl_->http.stop();
  if (impl_->http_thread.joinable()) impl_->http_thread.join();
  caf::anon_send_exit(impl_->api, caf::exit_reason::user_shutdown);
}

result<std::unique_ptr<api_server>> api_server::start(caf::actor_system& sys, caf::actor router,
                                                      const model_host& tokenizer_host,
                                                      api_config config,
                                                      std::shared_ptr<metrics_registry> metrics) {
  auto p = std::make_unique<impl>();
  p->sys = &sys;
  p->router = router;
  p->host = &tokenizer_host;
  p->cfg = std::move(config);
  if (p->cfg.served_model_name.empty()) p->cfg.served_model_name = tokenizer_host.id;
  p->metrics = std::move(metrics);
  const auto eog = tokenizer_host.tok.end_of_generation_ids();
  p->eog.assign(eog.begin(), eog.end());
  p->declare_metrics();
  p->api = sys.spawn(api_actor, router, p->hub);
  p->routes();
  int port = p->cfg.port == 0
                 ? p->http.bind_to_any_port(p->cfg.host.c_str())
                 : (p->http.bind_to_port(p->cfg.host.c_str(), p->cfg.port) ? p->cfg.port : -1);
  if (port <= 0) {
    caf::anon_send_exit(p->api, caf::exit_reason::user_shutdown);
    return make_error(errc::unavailable, "cannot listen on " + p->cfg.host + ":" +
                                             std::to_string(p->cfg.port) +
                                             " (is the port in use?)");
  }
  p->bound_port = static_cast<uint16_t>(port);
  auto* raw = p.get();
  p->http_thread = std::thread([raw] { raw->http.listen_after_bind(); });
  return std::unique_ptr<api_server>(new api_server(std::move(p)));
}

}  // namespace weft::serve
