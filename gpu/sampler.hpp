#pragma once
/// Token sampling: greedy, temperature, top-k, top-p, min-p, repetition / presence / frequency
/// penalties, a per-sequence seeded RNG, and top-n log-probabilities.
///
/// Each request owns its sampler, so a seed gives the same tokens whatever else is in the batch.
/// Not thread-safe (one sampler per sequence).

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace weft::gpu {

/// What a request asks of the sampler (OpenAI-style fields).
/// How an embedding request pools the prompt's hidden states.
enum class pooling_type : uint8_t { none = 0, mean = 1, last = 2 };

/// The most logit_bias entries a request may carry (OpenAI's API takes up to 300; llama-server
/// any number).
inline constexpr size_t kMaxLogitBias = 4096;

struct sampling_params {
  float temperature = 0.0f;  ///< <= 0: greedy (argmax).
  int32_t top_k = 0;         ///< 0: off.
  float top_p = 1.0f;        ///< 1: off.
  float min_p = 0.0f;        ///< 0: off; keeps tokens with p >= min_p * p_max.
  float repetition_penalty =
      1.0f;  ///< 1: off; divides positive / multiplies negative logits of seen tokens.
  float presence_penalty = 0.0f;   ///< Subtracted once from logits of seen tokens.
  float frequency_penalty = 0.0f;  ///< Subtracted per occurrence.
  int32_t penalty_last_n =
      64;  ///< Window of generated+prompt tokens the penalties look at (-1: all).
  /// OpenAI's logit_bias: (token, bias) pairs added to the logits before the penalties, the
  /// temperature and the truncations (greedy too); -100 bans a token in practice, +100 all but
  /// forces it. Ids outside the vocabulary are skipped (the API refuses them first). Not in the
  /// reported log-probabilities, which are the model's (as the penalties are not).
  std::vector<std::pair<int32_t, float>> logit_bias;
  uint64_t seed = 0;                 ///< RNG seed of this request.
  int32_t max_tokens = 128;          ///< Generated tokens before finishing with `length`.
  std::vector<int32_t> stop_tokens;  ///< Finish when one of these is sampled (not emitted).
  std::vector<std::string>
      stop_strings;        ///< Finish when the text contains one (text cut before it).
  int32_t n_logprobs = 0;  ///< Top-n log-probabilities to return per token (0: none).
  /// Log-probabilities (of the chosen token and the top-n) under log-softmax(logits / temperature),
  /// the distribution a token is drawn from before any truncation (top-k, top-p, min-p filter it
  /// and are not in it): RL's behaviour policy, which the trainer recomputes at the same
  /// temperature. Off (the default): log-softmax of the raw logits, as the OpenAI API reports.
  /// Greedy requests (temperature <= 0) always report the raw logits'.
  bool tempered_logprobs = false;
  /// Structured outputs: GBNF the generated text must match (gpu/grammar.hpp; empty: none). The
  /// engine masks every step's logits to the tokens that keep the text a valid prefix; the stop
  /// tokens are allowed exactly when it is a complete sentence.
  std::string grammar;
  /// Embeddings instead of text (`/v1/embeddings`): the engine computes the prompt and returns the
  /// final hidden states pooled — the mean over the prompt's tokens, or the last token's — in
  /// request_output::embedding, then finishes (max_tokens is not used; nothing is sampled).
  pooling_type pooling = pooling_type::none;
  /// Scheduling priority under gpu::priority_policy (lower runs first, vLLM's convention; ties by
  /// arrival). Not a sampling setting: it changes when the request runs, never its tokens. Other
  /// policies do not read it, so callers refuse a nonzero value unless the engine ranks by it.
  int32_t priority = 0;
};

/// A token with its log-probability under the model (log-softmax of the raw logits, or of the
/// tempered logits with sampling_params::tempered_logprobs).
struct token_logprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

/// One sampled token.
struct sample_result {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<token_logprob> top;  ///< Top-n alternatives, best first (n = n_logprobs).
};

/// Samples tokens for one sequence.
class sampler {
 public:
  explicit sampler(sampling_params params);

  const sampling_params& params() const { return params_; }

  /// Samples from `logits` (one row, n_vocab values); `history` is the sequence so far (prompt +
  /// generated), used by the penalties.
  sample_result sample(std::span<const float> logits, std::span<const int32_t> history);
  /// Advances the RNG past the draws `n` earlier samples consumed (one each when temperature > 0,
  /// none when greedy): a resumed sequence then continues with the same random stream.
  void skip_draws(int64_t n);

 private:
  /// Fills the chosen token's log-probability (and the top alternatives when asked for) under the
  /// model's distribution, whose log-normaliser is `log_z`.
  sample_result finish(sample_result res, std::span<const float> logits, double log_z) const;

  sampling_params params_;
  std::mt19937_64 rng_;
  std::vector<float> work_;
  std::vector<int32_t> ids_;
  std::vector<float> probs_;  ///< e^((l - max) / T) of the untruncated path
};

}  // namespace weft::gpu
