// The OpenAI-compatible HTTP front of `weft serve` and the api actor between it and the router.

#include "actors/serve/api_server.hpp"
#include "actors/serve/api_server_impl.hpp"
#include "actors/serve/chat_page.hpp"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <optional>
#include <random>
#include <thread>

#include "actors/auth.hpp"
#include "actors/serve/http_queue.hpp"
#include "actors/serve/serve_atoms.hpp"
#include "actors/serve/stream_hub.hpp"
#include "actors/serve/wire_convert.hpp"
#include "schema/caf_bridge.hpp"

namespace weft::serve {

using schema::envelope;
namespace wire = schema::wire;
using namespace api_internal;

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

}  // namespace

// -- helpers -------------------------------------------------------------------------------------

namespace api_internal {

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

}  // namespace api_internal

// -- the server -----------------------------------------------------------------------------------

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
