#pragma once
/// A continuous-batching inference engine over one model and one KV cache, driven step by step by
/// its owner (a worker actor, the `weft generate` command, a benchmark). No CAF here.
///
/// Each `step()` schedules one forward pass: every running request that is decoding contributes one
/// token, then prompt chunks of requests still in prefill fill the remaining token budget (chunked
/// prefill). Admission is FCFS; when the KV cache runs out, the most recently admitted request is
/// swapped out to host memory and resumed later. Every request's KV blocks are freed exactly once,
/// whether it finishes, is aborted or fails. Not thread-safe: call from one thread.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpu/kv_cache.hpp"
#include "gpu/model.hpp"
#include "gpu/sampler.hpp"
#include "gpu/status.hpp"

namespace weft::gpu {

/// Caller-chosen request identifier.
using request_id = uint64_t;

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
  int64_t kv_blocks = 1024;         ///< KV cache size in blocks.
  int64_t block_size = 16;          ///< Tokens per KV block.
  int64_t max_batch_tokens = 256;   ///< Token budget of one forward pass.
  int64_t max_running = 32;         ///< Requests decoding concurrently.
  bool prefix_cache = true;         ///< Reuse cached full blocks of earlier prompts.
  /// Text of a token, for stop strings and text deltas (optional: without it, stop strings are
  /// ignored and text_delta stays empty).
  std::function<std::string(int32_t)> detokenize;
};

/// What one step produced for one request.
struct request_output {
  request_id id = 0;
  std::vector<int32_t> new_tokens;
  std::string text_delta;            ///< New text, holding back a possible stop-string prefix.
  std::vector<sample_result> samples;  ///< Per new token (log-probs when requested).
  finish_reason finish = finish_reason::none;
  int64_t cached_prompt_tokens = 0;  ///< Prompt tokens served from the prefix cache.
  std::string error;                 ///< Set when finish == error.
};

/// Engine counters.
struct engine_stats {
  kv_stats kv;
  int64_t n_waiting = 0;
  int64_t n_running = 0;
  int64_t n_swapped = 0;
  int64_t n_steps = 0;
  int64_t n_prefill_tokens = 0;
  int64_t n_decode_tokens = 0;
  int64_t n_preemptions = 0;
};

/// The engine.
class engine {
 public:
  /// Creates an engine for `m` (which must outlive it), allocating the KV cache on m's device.
  static result<std::unique_ptr<engine>> create(model& m, const engine_config& config);
  ~engine();

  /// Queues a request. invalid_argument for a duplicate id, an empty prompt or a bad token.
  status add_request(request_id id, std::vector<int32_t> prompt, sampling_params params);
  /// Runs one forward pass; returns the outputs of every request that produced tokens or finished.
  result<std::vector<request_output>> step();
  /// Stops a request and frees its KV blocks; not_found when unknown or already finished.
  status abort(request_id id);
  /// True while any request is waiting, running or swapped.
  bool has_work() const;
  engine_stats stats() const;
  kv_cache& kv() { return *kv_; }

 private:
  enum class phase { waiting, prefill, decode, swapped };
  struct request {
    request_id id = 0;
    std::vector<int32_t> tokens;      ///< Prompt + generated.
    int64_t n_prompt = 0;
    int64_t n_computed = 0;           ///< Tokens whose K/V are in the cache.
    int64_t n_cached = 0;
    phase ph = phase::waiting;
    seq_id seq = 0;
    bool has_seq = false;
    sampler smp;
    std::string text;                 ///< Generated text so far.
    size_t text_emitted = 0;
    int64_t n_generated = 0;
    uint64_t admit_order = 0;
  };

  engine(model& m, std::unique_ptr<kv_cache> kv, const engine_config& config);
  void admit();
  void release(request& r);
  bool preempt_one(request_id keep);
  void finish_text(request& r, request_output& out, bool final);

  model& model_;
  std::unique_ptr<kv_cache> kv_;
  engine_config config_;
  std::unordered_map<request_id, std::unique_ptr<request>> requests_;
  std::deque<request_id> waiting_;
  std::vector<request_id> running_;   ///< Admission order.
  std::deque<request_id> swapped_;
  uint64_t admit_counter_ = 0;
  engine_stats counters_;
  std::vector<request_output> pending_;   ///< Outputs produced outside step() (errors at admission).
};

}  // namespace weft::gpu
