// The request flow of the OpenAI generation and embedding endpoints (api_server::impl): parse,
// tokenize, fit the context, admit, then answer as an SSE stream or one JSON body.

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "actors/auth.hpp"
#include "actors/serve/api_server_impl.hpp"
#include "actors/serve/openai_embeddings.hpp"

namespace weft::serve {

using namespace api_internal;
namespace wire = schema::wire;

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
  for (const auto& [t, bias] : r->sampling.logit_bias) {
    if (t >= n_vocab) {
      send_error(
          res, api_error{400, "invalid_request_error",
                         "logit_bias token " + std::to_string(t) +
                             " is outside the vocabulary (0.." + std::to_string(n_vocab - 1) + ")",
                         "logit_bias", ""});
      return false;
    }
  }
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

}  // namespace weft::serve
