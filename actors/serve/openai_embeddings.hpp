#pragma once
/// POST /v1/embeddings of `weft serve` (docs/serving.md, "Embeddings"), as plain functions: the
/// request body read and checked, the response rendered (floats or base64 of little-endian f32, as
/// OpenAI's client asks by default). The vectors come from the engine (sampling_params::pooling:
/// the final hidden states, pooled); the api server runs the requests. No CAF, no HTTP here.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "actors/serve/openai_api.hpp"
#include "gpu/sampler.hpp"
#include "gpu/tokenizer.hpp"

namespace weft::serve {

/// A checked /v1/embeddings request.
struct embeddings_request {
  std::string model;
  /// One token list per input ("input" is a string, a list of strings, a list of token ids or a
  /// list of lists of token ids; text is tokenized with the model's BOS, as llama.cpp does).
  std::vector<std::vector<int32_t>> inputs;
  bool base64 = false;    ///< encoding_format "base64" (else "float")
  bool normalize = true;  ///< L2-normalized vectors (OpenAI's are; vLLM's `normalize` turns it off)
};

/// Limits of one request.
struct embeddings_limits {
  size_t max_inputs = 2048;  ///< OpenAI's limit on the inputs of one request
  int64_t max_tokens = 0;    ///< per input: the server's context (0: none)
  int64_t n_embd = 0;        ///< the model's width: "dimensions" must equal it when given
};

/// Reads and checks the body: a 400 (with `param`) for malformed JSON, a missing or empty input,
/// wrong types, a token id outside the vocabulary, an input longer than max_tokens
/// ("context_length_exceeded"), "dimensions" other than the model's, an unknown encoding_format.
struct embeddings_parse {
  std::optional<embeddings_request> request;
  api_error error;
};
embeddings_parse parse_embeddings_request(std::string_view body, const gpu::tokenizer& tok,
                                          const embeddings_limits& limits);

/// Scales `v` to unit L2 norm (a zero vector stays zero).
void l2_normalize(std::vector<float>& v);

/// The response body: {"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
/// "model", "usage": {"prompt_tokens", "total_tokens"}}.
std::string render_embeddings(const std::string& model, const std::vector<std::vector<float>>& vecs,
                              bool base64, int64_t prompt_tokens);

/// The pooling a server option names ("mean" or "last"); nullopt for anything else.
std::optional<gpu::pooling_type> parse_pooling(std::string_view name);

}  // namespace weft::serve
