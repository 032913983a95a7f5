#pragma once
/// A continuous-batching inference engine over one model and one KV cache, driven step by step by
/// its owner (a worker actor, the `weft generate` command, a benchmark). No CAF here.
///
/// Each `step()` asks the scheduling policy (schedule_policy.hpp; FCFS by default) to rank every
/// live request, then schedules the first `max_running` requests in rank order whose KV fits: a
/// waiting request is admitted, a swapped one is swapped back in, and a higher-ranked request that
/// needs KV blocks swaps lower-ranked resident ones out to host memory, lowest-ranked first
/// (token-level preemption; a displaced request whose KV fits keeps it and just pauses). The
/// forward pass takes one token of every scheduled decoding request, then prompt chunks of
/// scheduled requests in prefill fill the remaining token budget (chunked prefill). If the cache
/// still runs out during the pass, paused requests are swapped out first, then the lowest-ranked
/// scheduled one. A request's tokens do not depend on scheduling (batch invariance): pausing,
/// swapping and resuming leave its outputs unchanged. Every request's KV blocks are freed exactly
/// once, whether it finishes, is aborted or fails. Not thread-safe: call from one thread.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpu/grammar.hpp"
#include "gpu/kv_cache.hpp"
#include "gpu/model.hpp"
#include "gpu/sampler.hpp"
#include "gpu/schedule_policy.hpp"
#include "gpu/status.hpp"

namespace weft::gpu {

/// Why a request stopped.
enum class finish_reason {
  none,         ///< Still running.
  stop_token,   ///< Sampled one of sampling_params::stop_tokens.
  stop_string,  ///< The text contains a stop string.
  length,       ///< Reached max_tokens (or the model's context).
  aborted,      ///< abort() was called.
  error,        ///< The request could not be served (e.g. prompt larger than the whole cache).
};

/// Name of a finish reason ("stop", "length", ...), as the OpenAI API spells it where it has one.
const char* finish_reason_name(finish_reason r);

/// Engine settings.
struct engine_config {
  int64_t kv_blocks = 1024;        ///< KV cache size in blocks.
  int64_t block_size = 16;         ///< Tokens per KV block.
  int64_t max_batch_tokens = 256;  ///< Token budget of one forward pass.
  /// Token budget of a pass in which a migrated request is being rebuilt (its prompt and replayed
  /// tokens): larger, so that every migrated sequence gets its next token soon after its worker
  /// died (docs/serving.md, "Recovery"). 0 or less than max_batch_tokens: max_batch_tokens.
  int64_t rebuild_batch_tokens = 0;
  /// Token budget of a pass with no decode in it (only prompt chunks): no running stream's TPOT
  /// to protect, so a long prompt takes fewer, larger chunks (its attention re-reads the keys
  /// before the chunk once per pass). 0 or less than max_batch_tokens: max_batch_tokens.
  int64_t idle_batch_tokens = 0;
  int64_t max_running = 32;  ///< Requests decoding concurrently.
  bool prefix_cache = true;  ///< Reuse cached full blocks of earlier prompts.
  /// With prefix_cache, also reuse the leading tokens of one more cached block (token-granular,
  /// kv_cache_config::leading_token_matches). Those rows were computed in another request's pass:
  /// outputs stay the same where prefill is chunk-invariant (the quantized kernels), while f32
  /// weights run OpenBLAS, whose rounding can depend on the pass's size. RL rollout engines turn
  /// it off so that a run repeats bit for bit whatever the timing of admissions.
  bool prefix_partial = true;
  /// A resumed request may also take cached blocks of its replayed tokens (normally rebuilt with
  /// decode numerics). Exact only when no request's prompt (prefill numerics) holds tokens another
  /// one generated: true for an RL rollout engine, whose continuations after a tool call replay
  /// everything after the problem's prompt (gpu/rl/rollout_backend.hpp).
  bool prefix_into_replay = false;
  /// Mixture-of-experts routing replay (RL, docs/rl.md): keep the experts each computed token was
  /// routed to and hand them over with the request's last output (request_output::routes). Needs
  /// a model loaded with record_expert_ids. The routes are also kept beside each token's K/V
  /// (kv_cache_config::slot_payload_bytes), so a prefix-cache hit brings the routes of the pass
  /// that computed the cached blocks; KV from elsewhere (add_prefilled_request,
  /// add_imported_request) carries none and is refused.
  bool record_routes = false;
  /// Text of a token, for stop strings and text deltas (optional: without it, stop strings are
  /// ignored and text_delta stays empty).
  std::function<std::string(int32_t)> detokenize;
  /// Ranks live requests every step (shared so the owner can inspect it; one instance per engine:
  /// policies keep per-request state). Null = fcfs_policy.
  std::shared_ptr<schedule_policy> policy;
  /// Structured outputs (sampling_params::grammar): the vocabulary's bytes as a trie, built once
  /// from the tokenizer. Without it a request with a grammar is refused.
  std::shared_ptr<const grammar::token_trie> vocab;
};

/// What one step produced for one request.
struct request_output {
  request_id id = 0;
  std::vector<int32_t> new_tokens;
  std::string text_delta;              ///< New text, holding back a possible stop-string prefix.
  std::vector<sample_result> samples;  ///< Per new token (log-probs when requested).
  /// finish == stop_token: the stop token that was sampled (not in new_tokens), with its
  /// log-probability (RL trains on it: the policy learns when to stop).
  sample_result stop_sample;
  finish_reason finish = finish_reason::none;
  int64_t cached_prompt_tokens = 0;  ///< Prompt tokens served from the prefix cache.
  std::string error;                 ///< Set when finish == error.
  /// An embedding request (sampling_params::pooling): the pooled final hidden state, [n_embd],
  /// with finish == length; nothing else.
  std::vector<float> embedding;
  /// engine_config::record_routes, on the output that finishes the request: for every position
  /// the engine computed (the prompt and every generated token but the last), the experts of
  /// each MoE layer, [positions][layers][experts used], in the model's routing order.
  std::vector<uint8_t> routes;
};

/// Engine counters.
struct engine_stats {
  kv_stats kv;
  int64_t n_waiting = 0;  ///< Not admitted yet (no KV).
  int64_t n_running = 0;  ///< KV resident on the device (includes paused).
  int64_t n_paused = 0;   ///< Resident but not in the last forward pass.
  int64_t n_swapped = 0;  ///< KV in host memory.
  int64_t n_steps = 0;    ///< Forward passes run.
  int64_t n_prefill_tokens = 0;
  int64_t n_decode_tokens = 0;
  /// Times a request that had tokens in a forward pass was left out of the next one while still
  /// live (displaced by a higher-ranked request, or dropped from a batch that ran out of KV).
  int64_t n_preemptions = 0;
  int64_t n_swaps_out = 0;  ///< Sequences moved to host memory.
  int64_t n_swaps_in = 0;   ///< Sequences moved back to the device.
  /// Requests that waited to be admitted because a resident request was still prefilling blocks
  /// of their prompt (in-flight prefix sharing: they reuse those blocks instead of computing them).
  int64_t n_prefix_waits = 0;
  /// Seconds spent in step() (wall clock, cumulative), and the parts of it in forward passes and
  /// in sampling (log-probabilities included); the rest is scheduling, detokenizing and stop rules.
  double step_s = 0.0;
  double forward_s = 0.0;
  double sample_s = 0.0;
  /// Forward passes that carried prompt tokens: their seconds and all their tokens (prompt and
  /// decode) — what a worker's prefill rate is measured from (tokens a second while prefilling,
  /// whatever share of the time it prefills or how much of each prompt the prefix cache served).
  double prefill_pass_s = 0.0;
  int64_t prefill_pass_tokens = 0;
};

/// A decoding request taken out of the engine with its KV (disaggregated prefill: the KV is handed
/// to another engine). The caller owns `seq` and frees it with kv().free_sequence().
struct detached_request {
  seq_id seq = 0;
  std::vector<int32_t> tokens;  ///< Prompt + generated; the KV holds all but the last one.
  int64_t n_generated = 0;      ///< Tokens generated in this engine (the last ones of `tokens`).
};

/// The engine.
class engine {
 public:
  /// Creates an engine for `m` (which must outlive it), allocating the KV cache on m's device.
  static result<std::unique_ptr<engine>> create(model& m, const engine_config& config);
  ~engine();

  /// Queues a request. invalid_argument for a duplicate id, an empty prompt or a bad token.
  status add_request(request_id id, std::vector<int32_t> prompt, sampling_params params);
  /// Resumes a request generated elsewhere (migration): `prompt` is the original prompt followed by
  /// the `n_replay` tokens generated so far. The prompt is prefilled as usual; the replayed tokens
  /// are computed with single-token (decode) numerics, which rebuilds exactly the KV and logits of
  /// the original decode steps, and a seeded sampler skips the random draws they consumed. The
  /// request then continues as if it had never moved: same tokens as an undisturbed run.
  /// `params.max_tokens` counts new tokens only.
  status add_resumed_request(request_id id, std::vector<int32_t> prompt, int64_t n_replay,
                             sampling_params params);
  /// For a request that already made its client wait (a migrated sequence whose next token is
  /// overdue, or one that was queued on a worker that died): until it produces its first token
  /// here it is ranked after the requests running ahead of it in the policy's order (they are not
  /// displaced) and before every other one, expedited requests among themselves in arrival order;
  /// and for its whole life it runs on top of `max_running` (it is another worker's load; KV still
  /// has to fit). not_found for an unknown id.
  status expedite(request_id id);
  /// Adds a request whose KV was computed elsewhere (disaggregated decode, after a KV import):
  /// `seq` (the engine owns it from now, also on error) holds the KV of all but the last of
  /// `tokens`; the last `n_generated` tokens were generated and streamed already (each consumed one
  /// random draw of a seeded sampler, skipped here). The request starts decoding at the next step;
  /// `params.max_tokens` counts new tokens only. invalid_argument when the cache length of `seq`
  /// is not tokens.size() - 1, for a duplicate id or a bad token.
  status add_imported_request(request_id id, seq_id seq, std::vector<int32_t> tokens,
                              int64_t n_generated, sampling_params params);
  /// Queues a request whose prompt starts with KV already in `seq` (fetched from a prefix-cache
  /// pool): the engine owns `seq` from now, also on error. The cached tokens (kv().length(seq),
  /// which must equal the first tokens of `prompt` and leave at least two to compute) are reported
  /// as cached_prompt_tokens; the rest is prefilled as usual. With `n_replay` > 0 it is a resumed
  /// request (see add_resumed_request: the last `n_replay` tokens of `prompt` were generated
  /// elsewhere) whose KV came from the pool: the cache may then also cover the whole original
  /// prompt and some of the generated tokens (decode-computed KV; at least one token left), and
  /// the generated tokens it does not cover are recomputed with decode numerics.
  status add_prefilled_request(request_id id, seq_id seq, std::vector<int32_t> prompt,
                               sampling_params params, int64_t n_replay = 0);
  /// The tokens (prompt + generated) of a live request; empty when unknown.
  std::span<const int32_t> tokens(request_id id) const;
  /// A new sequence sharing every KV block of a resident request (copy-on-write): a read-only
  /// snapshot of its KV for the caller, who frees it with kv().free_sequence(). invalid_argument
  /// when the request has no resident KV.
  result<seq_id> fork_kv(request_id id);
  /// Takes a decoding request out of the engine, keeping its KV (see detached_request): the
  /// request produces no more output here. invalid_argument unless it is resident and decoding.
  result<detached_request> detach(request_id id);
  /// Runs one forward pass; returns the outputs of every request that produced tokens or finished.
  result<std::vector<request_output>> step();
  /// Stops a request and frees its KV blocks; not_found when unknown or already finished.
  status abort(request_id id);
  /// True while any request is waiting, running or swapped.
  bool has_work() const;
  engine_stats stats() const;
  /// Prompt and decode tokens computed by forward passes so far (stats()'s two counters, without
  /// its walk over the requests: the worker reads it around every step).
  int64_t tokens_computed() const { return counters_.n_prefill_tokens + counters_.n_decode_tokens; }
  kv_cache& kv() { return *kv_; }

 private:
  enum class phase { waiting, prefill, decode, swapped };
  struct request {
    request(request_id rid, std::vector<int32_t> prompt, sampling_params params)
        : id(rid), tokens(std::move(prompt)), smp(std::move(params)) {}

    request_id id = 0;
    std::vector<int32_t> tokens;  ///< Prompt + generated.
    int64_t n_prompt = 0;         ///< Tokens to prefill (original prompt + replayed tokens).
    int64_t n_replay = 0;         ///< Trailing prefill tokens computed with decode numerics.
    int64_t n_computed = 0;       ///< Tokens whose K/V are in the cache.
    int64_t n_cached = 0;
    phase ph = phase::waiting;
    seq_id seq = 0;
    bool has_seq = false;
    sampler smp;
    std::string text;  ///< Generated text so far.
    size_t text_emitted = 0;
    int64_t n_generated = 0;
    uint64_t arrival = 0;
    bool expedited = false;          ///< See expedite(): ranked first until its first token here.
    bool beyond_cap = false;         ///< See expedite(): not counted against max_running.
    bool scheduled = false;          ///< Had tokens in the last forward pass.
    bool waited_for_prefix = false;  ///< Counted in n_prefix_waits.
    std::unique_ptr<grammar::constraint> cons;  ///< Structured outputs, or null.
    std::vector<float> masked;                  ///< This step's logits under the grammar.
    std::vector<double> pooled;   ///< Embedding requests: the sum (mean) or last hidden state.
    std::vector<uint8_t> routes;  ///< engine_config::record_routes: [positions][layers][k].
    std::string routes_error;     ///< Routes could not be kept: the request fails at its next row.
    bool embeds() const { return smp.params().pooling != pooling_type::none; }

    bool resident() const { return ph == phase::prefill || ph == phase::decode; }
  };

  engine(model& m, std::unique_ptr<kv_cache> kv, const engine_config& config);
  /// Routing replay: the routes of r's first n tokens, attached from the prefix cache, from the
  /// cache's slot payload.
  void cached_routes(request& r, int64_t n);
  /// Stores the routes of request r's tokens in this pass (sequence index si of the batch).
  void record_routes(request& r, int32_t si, const forward_batch& batch,
                     const forward_output& fout);
  result<std::vector<request_id>> rank_live();
  size_t n_expedited_live() const;
  /// `order` (the policy's ranking) with the expedited requests moved up (see expedite()).
  std::vector<request_id> with_expedited_first(std::vector<request_id> order) const;
  std::vector<request_id> select(const std::vector<request_id>& order,
                                 std::vector<request_output>& outputs);
  bool make_room(int64_t need_blocks, const std::vector<request_id>& order, size_t lower_from);
  /// The pass's tokens for the selected requests within the step's budget: every decode first,
  /// then prompt and replay chunks in rank order (`in_batch`: the requests in it, in batch order).
  void fill_batch(const std::vector<request_id>& selected, forward_batch& batch,
                  std::vector<request_id>& in_batch) const;
  /// Fills the batch from `selected` and runs the model's forward pass; out of KV memory, swaps
  /// out requests (unselected ones first, lowest-ranked first in `order`) and tries again. Ok with
  /// an empty batch: nothing to run; an error: the batch's requests cannot run.
  status forward(const std::vector<request_id>& order, std::vector<request_id>& selected,
                 forward_batch& batch, forward_output& fout, std::vector<request_id>& in_batch);
  /// Samples every row whose logits came back (engine_sample.cpp) and turns it into its
  /// request's output: stop tokens and strings, length, grammar masks, text. Finished requests
  /// are added to `finished`.
  void sample_rows(const forward_batch& batch, const forward_output& fout,
                   const std::vector<request_id>& in_batch, std::vector<request_output>& outputs,
                   std::vector<request_id>& finished);
  /// Structured outputs: `logits` masked to the tokens that keep r's text a valid prefix of its
  /// grammar (in r.masked). False (r failed with a message) when no token may follow.
  bool mask_by_grammar(request& r, std::span<const float>& logits,
                       std::vector<request_output>& outputs);
  /// Gives `r` the next arrival number, makes it live and tells the policy.
  void enqueue(std::unique_ptr<request> r);
  void admit(request& r);
  /// Prompt tokens of `r` (what admit() may match from the cache) that a resident request is still
  /// prefilling: waiting for them saves computing them twice.
  bool prefix_in_flight(const request& r) const;
  status swap_out(request& r);
  void note_scheduled(const std::vector<request_id>& in_batch);
  void fail(request_id id, std::string message, std::vector<request_output>& outputs);
  /// Embedding requests: asks for the hidden states of the `chunk` tokens of `r` just added to
  /// `batch` (mean: all of them; last: the prompt's last token, in its last chunk).
  static void mark_hidden(forward_batch& batch, const request& r, int64_t chunk, bool last_chunk);
  /// Folds the pass's hidden states into their requests and finishes those whose prompt is done.
  void pool_hidden(const forward_batch& batch, const forward_output& fout,
                   const std::vector<request_id>& in_batch, std::vector<request_output>& outputs,
                   std::vector<request_id>& finished);
  void remove(request_id id);
  void release(request& r);
  void finish_text(request& r, request_output& out, bool final);
  /// A request that continues tokens generated elsewhere: its text starts with theirs, of which
  /// what the other engine held back from its deltas (an incomplete UTF-8 character, the start
  /// of a stop string) is still to be emitted.
  void resume_text(request& r, int64_t n_generated);
  /// Compiles (or finds) the request's grammar and feeds it the tokens generated before it came
  /// here (`generated`: a resumed or imported request's).
  status attach_grammar(request& r, std::span<const int32_t> generated);

  model& model_;
  std::unique_ptr<kv_cache> kv_;
  engine_config config_;
  std::unordered_map<request_id, std::unique_ptr<request>> requests_;
  /// Compiled grammars by text with their mask caches, shared by the requests that use them
  /// (bounded: cleared past 16).
  std::unordered_map<std::string, std::shared_ptr<grammar::mask_cache>> grammars_;
  std::vector<request_id> live_;  ///< Arrival order.
  uint64_t arrival_counter_ = 0;
  int64_t iteration_ = 0;  ///< step() calls.
  engine_stats counters_;
  std::vector<request_output>
      pending_;  ///< Outputs produced outside the forward (admission errors).
};

}  // namespace weft::gpu
