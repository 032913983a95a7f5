#pragma once
/// Loading a GGUF model for serving: the file, its tokenizer and chat template, and (for engine
/// workers) the device and the model weights. Plain C++, no CAF; used by engine workers and by the
/// `weft serve` front end (which only needs the tokenizer and template).

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpu/chat_template.hpp"
#include "gpu/device.hpp"
#include "gpu/gguf.hpp"
#include "gpu/model.hpp"
#include "gpu/tokenizer.hpp"
#include "schema/status.hpp"

namespace weft::serve {

/// Where `weft` looks for the default model: $WEFT_MODEL, else $WEFT_CACHE_DIR/models/<name>,
/// else ~/.cache/weft/models/<name> (what scripts/fetch_model.sh writes).
std::filesystem::path default_model_path();
inline constexpr const char* default_model_file = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The model id clients name in requests: the file name without ".gguf".
std::string model_id_for(const std::filesystem::path& path);

struct model_host_options {
  std::filesystem::path path;
  bool load_weights = true;  ///< false: tokenizer and template only
  std::string device = "cpu";
  int threads = 0;  ///< compute threads (0 = all cores)
  int64_t max_batch_tokens = 256;
  bool preload = true;  ///< read every page first, logging progress
  /// Where the weights live (huge pages: faster decode on CPU, private memory per process).
  gpu::gguf_memory weights_memory = gpu::gguf_memory::huge_pages;
  /// A Jinja chat template file to use instead of the model's (`--chat-template FILE`); one that
  /// cannot be read, parsed or rendered is an error.
  std::filesystem::path chat_template_file;
};

/// A loaded model. The tokenizer and template borrow nothing from the file once built.
struct model_host {
  std::string id;
  gpu::tokenizer tok;
  std::optional<gpu::chat_template> tmpl;  ///< absent if the file names none we know
  std::unique_ptr<gpu::device> dev;        ///< only with load_weights
  std::unique_ptr<gpu::model> model;       ///< only with load_weights
  int64_t n_ctx = 0;                       ///< training context of the model
  /// Bytes of one token's K and V over every layer in the (f16) KV cache, from the file's
  /// metadata (sizes prefix-cache segments without loading weights).
  int64_t kv_bytes_per_token = 0;
  int64_t n_embd = 0;  ///< width of the hidden state (the embeddings' dimensions)
};

/// Opens and (optionally) loads. Errors name the file and the step.
weft::result<std::unique_ptr<model_host>> load_model_host(const model_host_options& options);

/// Token ids of `user_text` as one user turn through the model's chat template, ready for the
/// assistant's answer (the raw text when the model has no template).
weft::result<std::vector<int32_t>> encode_user_turn(const model_host& host,
                                                    const std::string& user_text);

}  // namespace weft::serve
