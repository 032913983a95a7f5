#pragma once
/// Calling a pool of engine workers from your own code (docs/embedding.md). The pool is a router
/// (actors/serve/router.hpp) with engine workers behind it; a request goes to the router, which
/// places it, migrates it if its worker dies, and streams the tokens back exactly once.
///
/// Two forms:
/// - generate(): blocking, from main() or any thread that is not one of CAF's workers. Returns
///   the whole generation or an explicit error (router refused, worker error, timeout: then the
///   request is aborted, never left running).
/// - From an actor: send (serve::submit_atom, make_generate_request(...)) to the router with
///   request(); its reply is an envelope, ok or an Error (schema::error_from). The tokens then
///   arrive as (serve::chunk_atom, TokenChunk envelope) messages; feed them to a
///   generation_collector keyed by request id.
///
/// Plain types; only generate_client.cpp includes CAF's heavy headers.

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gpu/sampler.hpp"
#include "schema/envelope.hpp"

namespace weft::serve {

/// One finished generation.
struct generation {
  uint64_t request_id = 0;
  std::vector<int32_t> tokens;  ///< generated tokens, in order, each once
  std::string finish;           ///< "stop" (stop token or string), "length", "aborted"
  uint32_t prompt_tokens = 0;
  uint32_t cached_tokens = 0;  ///< prompt tokens served from a prefix cache
  uint32_t attempts = 1;       ///< 1 + migrations to another worker (a worker died)
  std::string worker;          ///< the worker that finished it
  /// An embedding request (params.pooling): the pooled final hidden state, not normalized.
  std::vector<float> embedding;
};

/// A fresh request id (random, never 0): ids must be unique among the router's outstanding
/// requests, and the router refuses a duplicate.
uint64_t new_request_id();

/// The GenerateRequest for `prompt` (token ids; tokenize with gpu::tokenizer). `deadline_ms`:
/// unix ms after which the workers abandon it (0: none). Stop tokens (the model's end of turn)
/// belong in `params.stop_tokens`.
schema::envelope make_generate_request(uint64_t request_id, std::span<const int32_t> prompt,
                                       const gpu::sampling_params& params,
                                       uint64_t deadline_ms = 0);

/// The request id of a TokenChunk envelope (0 when it is none or does not decode): which
/// collector a chunk belongs to.
uint64_t chunk_request_id(const schema::envelope& chunk);

/// Folds one request's TokenChunks into a generation. Checks what the router guarantees: tokens
/// arrive at consecutive positions (a gap or an overlap is an error, never silently patched).
class generation_collector {
 public:
  explicit generation_collector(uint64_t request_id) { out_.request_id = request_id; }
  /// Adds a TokenChunk. Errors: malformed chunk, another request's chunk, a position gap or
  /// overlap, a chunk after the finish, or the chunk reports the request failed (its error).
  status add(const schema::envelope& chunk);
  bool done() const { return done_; }
  /// The generation so far (complete once done()).
  const generation& result() const { return out_; }

 private:
  generation out_;
  bool done_ = false;
};

/// Blocking: submits `prompt` to the pool behind `router` and waits for the whole generation.
/// Errors: the router's refusal (overloaded, unavailable, ...), the request's error, or timeout
/// after `timeout_ms` (the request is then aborted).
result<generation> generate(caf::actor_system& sys, const caf::actor& router,
                            std::span<const int32_t> prompt, const gpu::sampling_params& params,
                            uint32_t timeout_ms = 60'000);

}  // namespace weft::serve
