#include "actors/serve/generate_client.hpp"

#include <caf/all.hpp>

#include <chrono>

#include "actors/auth.hpp"
#include "actors/serve/serve_atoms.hpp"
#include "actors/serve/wire_convert.hpp"
#include "schema/caf_bridge.hpp"

namespace weft::serve {

using schema::envelope;
namespace wire = schema::wire;

uint64_t new_request_id() {
  for (;;) {
    auto bytes = actors::random_bytes(8);
    uint64_t id = 0;
    for (uint8_t b : bytes) id = (id << 8) | b;
    id >>= 1;  // 63 bits: stays positive wherever it is printed as a signed number
    if (id != 0) return id;
  }
}

envelope make_generate_request(uint64_t request_id, std::span<const int32_t> prompt,
                               const gpu::sampling_params& params, uint64_t deadline_ms) {
  generate_spec spec;
  spec.request_id = request_id;
  spec.trace_id = "sdk-" + std::to_string(request_id);
  spec.prompt.assign(prompt.begin(), prompt.end());
  spec.params = params;
  spec.want_logprobs = params.n_logprobs > 0;
  spec.deadline_ms = deadline_ms;
  return to_wire(spec);
}

uint64_t chunk_request_id(const envelope& chunk) {
  auto c = chunk.read<wire::TokenChunk>();
  return c ? c->get().getRequestId() : 0;
}

status generation_collector::add(const envelope& env) {
  auto c = env.read<wire::TokenChunk>();
  if (!c) return c.error();
  auto chunk = c->get();
  if (chunk.getRequestId() != out_.request_id) {
    return make_error(errc::invalid_argument,
                      "chunk of request " + std::to_string(chunk.getRequestId()) +
                          " given to the collector of " + std::to_string(out_.request_id));
  }
  if (done_) return make_error(errc::invalid_argument, "chunk after the request finished");
  if (chunk.getPosition() != out_.tokens.size()) {
    return make_error(errc::internal, "token stream of request " + std::to_string(out_.request_id) +
                                          " jumps from position " +
                                          std::to_string(out_.tokens.size()) + " to " +
                                          std::to_string(chunk.getPosition()));
  }
  for (int32_t t : chunk.getTokens()) out_.tokens.push_back(t);
  for (float x : chunk.getEmbedding()) out_.embedding.push_back(x);
  std::string worker = chunk.getWorker().cStr();
  if (!worker.empty()) {
    if (!out_.worker.empty() && worker != out_.worker) ++out_.attempts;
    out_.worker = std::move(worker);
  }
  if (chunk.getPromptTokens() > 0) out_.prompt_tokens = chunk.getPromptTokens();
  out_.cached_tokens = std::max(out_.cached_tokens, chunk.getCachedTokens());
  switch (chunk.getFinish()) {
    case wire::FinishReason::NONE:
      return {};
    case wire::FinishReason::STOP_TOKEN:
    case wire::FinishReason::STOP_STRING:
      out_.finish = "stop";
      break;
    case wire::FinishReason::LENGTH:
      out_.finish = "length";
      break;
    case wire::FinishReason::ABORTED:
      out_.finish = "aborted";
      break;
    case wire::FinishReason::ERROR: {
      done_ = true;
      out_.finish = "error";
      if (chunk.hasError()) {
        return make_error(schema::from_wire(chunk.getError().getCode()),
                          chunk.getError().getMessage().cStr());
      }
      return make_error(errc::internal, "the request failed without an error message");
    }
  }
  done_ = true;
  return {};
}

result<generation> generate(caf::actor_system& sys, const caf::actor& router,
                            std::span<const int32_t> prompt, const gpu::sampling_params& params,
                            uint32_t timeout_ms) {
  if (!router) return make_error(errc::invalid_argument, "no router to send the request to");
  const uint64_t id = new_request_id();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  caf::scoped_actor self{sys};
  status admitted = make_error(errc::timeout, "no answer from the router");
  self->request(router, std::chrono::milliseconds(timeout_ms), submit_atom::value,
                make_generate_request(id, prompt, params, actors::now_ms() + timeout_ms))
      .receive([&](const envelope& reply) { admitted = schema::error_from(reply); },
               [&](caf::error& err) {
                 admitted =
                     make_error(errc::unavailable, "router unavailable: " + caf::to_string(err));
               });
  if (!admitted.ok()) return admitted;
  generation_collector collector(id);
  status failed;
  bool timed_out = false;
  while (!collector.done() && failed.ok() && !timed_out) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::milliseconds(0)) {
      timed_out = true;
      break;
    }
    self->receive(
        [&](chunk_atom, const envelope& env) {
          if (chunk_request_id(env) != id) return;  // not ours (cannot happen here)
          failed = collector.add(env);
        },
        caf::after(std::chrono::duration_cast<std::chrono::milliseconds>(left)) >>
            [&] { timed_out = true; });
  }
  if (timed_out) {
    auto abort = envelope::build<wire::AbortRequest>([&](wire::AbortRequest::Builder b) {
      b.setRequestId(id);
      b.setReason("client timeout");
    });
    self->send(router, abort_atom::value, abort);
    return make_error(errc::timeout, "generation did not finish within " +
                                         std::to_string(timeout_ms) + " ms (aborted)");
  }
  if (!failed.ok()) return failed;
  return collector.result();
}

}  // namespace weft::serve
