#pragma once
/// Llama-family transformer (dense or MoE FFN) running on a device, weights straight from GGUF.
///
/// Weights stay in their file format (memory-mapped on host-visible devices, uploaded once
/// otherwise); nothing is dequantized wholesale. One `forward` runs a batch that mixes prefill
/// chunks and decode tokens of different sequences over the paged KV cache (continuous batching).
/// The forward is written as a chain of per-layer steps on named activation buffers so that a
/// backward pass can later reuse the same structure (see docs/engine.md).

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpu/compute_ops.hpp"
#include "gpu/device.hpp"
#include "gpu/gguf.hpp"
#include "gpu/kv_cache.hpp"
#include "gpu/status.hpp"
#include "gpu/tensor_view.hpp"

namespace weft::gpu {

/// Hyper-parameters read from GGUF metadata (<arch>.* keys).
struct model_hparams {
  std::string architecture;
  int64_t n_vocab = 0;
  int64_t n_embd = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t n_ff = 0;
  int64_t n_ctx_train = 0;
  float rms_eps = 1e-5f;
  rope_config rope;
  int64_t n_experts = 0;  ///< 0 for a dense FFN.
  int64_t n_experts_used = 0;
  bool tied_output = false;  ///< output.weight absent: token_embd is reused.
};

/// Reads the hyper-parameters of a llama-family GGUF (an error names the missing or bad key).
result<model_hparams> read_model_hparams(const gguf_file& f);

/// Weights of one transformer block.
struct layer_weights {
  tensor_view attn_norm, wq, wk, wv, wo;
  tensor_view ffn_norm;
  tensor_view ffn_gate, ffn_up, ffn_down;                               ///< Dense FFN.
  tensor_view ffn_gate_inp, ffn_gate_exps, ffn_up_exps, ffn_down_exps;  ///< MoE FFN.
};

/// A batch for one forward pass. Tokens of one sequence appear in position order and continue
/// that sequence in the cache (their positions are kv.length(seq), kv.length(seq) + 1, ...).
struct forward_batch {
  std::vector<seq_id> seqs;  ///< Distinct sequences of the batch.
  std::vector<int32_t> tokens;
  std::vector<int32_t> seq_index;    ///< Per token: index into `seqs`.
  std::vector<uint8_t> want_logits;  ///< Per token: 1 to return its logits.
  /// Per sequence: 1 = compute every token of its chunk with single-token (decode) numerics, as if
  /// each had been decoded alone. Replaying generated tokens this way rebuilds exactly the KV and
  /// logits the original decode steps produced (request migration, docs/engine.md).
  std::vector<uint8_t> decode_numerics;
  /// Per token (empty: none): 1 to return its final hidden state (after the output norm, the
  /// input of the output head) in forward_output::hidden instead of logits — embeddings. A token
  /// asks for logits or its hidden state, not both (want_hidden wins).
  std::vector<uint8_t> want_hidden;

  /// Appends `tokens` of sequence `seq`; logits are requested for the last one when `logits_last`.
  /// `as_decode`: see decode_numerics (applies to all of the sequence's tokens in this batch).
  void add(seq_id seq, std::span<const int32_t> toks, bool logits_last, bool as_decode = false);
  void clear();
};

/// Logits of the tokens that asked for them, in batch order.
struct forward_output {
  int64_t n_vocab = 0;
  std::vector<int32_t> token_index;  ///< Batch index of each logits row.
  std::vector<float> logits;         ///< [token_index.size()][n_vocab], host memory.
  std::vector<std::vector<int32_t>>
      expert_ids;  ///< MoE: per layer, [n_tokens][n_experts_used] routed experts.
  std::vector<int32_t> hidden_index;  ///< Batch index of each hidden row (want_hidden).
  std::vector<float> hidden;          ///< [hidden_index.size()][n_embd], host memory.
};

/// How a model is loaded.
struct model_load_config {
  int64_t max_batch_tokens = 512;  ///< Upper bound of tokens per forward (activation buffers).
  bool record_expert_ids = false;  ///< Fill forward_output::expert_ids (routing replay).
};

/// A loaded model. Not thread-safe; drive it from one thread.
class model {
 public:
  /// Loads the model in `file` (moved in, kept mapped) onto `dev` (which must outlive the model).
  static result<std::unique_ptr<model>> load(gguf_file file, device& dev,
                                             const model_load_config& config = {});
  ~model();
  model(const model&) = delete;
  model& operator=(const model&) = delete;

  const model_hparams& hparams() const { return hp_; }
  const model_load_config& load_config() const { return config_; }
  const gguf_file& file() const { return file_; }
  device& dev() { return dev_; }
  /// The KV layout this model needs.
  kv_layout kv_layout_for(int64_t block_size) const;
  /// Bytes of weights read for one decode step (all matrices once, plus one embedding row).
  size_t weight_bytes_per_token() const;
  /// Multiply-accumulates of the weight matrices per token (attention over the cache excluded).
  int64_t matmul_macs_per_token() const;

  /// Runs the batch: stores its K/V in `kv`, commits its tokens to their sequences and returns the
  /// requested logits. Reserves cache blocks itself; out_of_memory leaves the cache consistent.
  status forward(const forward_batch& batch, kv_cache& kv, forward_output& out);

  /// Allocates the activation buffers of passes of up to `n_tokens` tokens, `n_logit_rows` of
  /// them producing logits, now rather than in the first pass that needs them (forward grows them
  /// when a pass needs more). The engine reserves its largest step budget at construction, as
  /// llama.cpp reserves its compute buffers: a server's first long prompt would otherwise pay for
  /// zeroing fresh memory.
  status reserve(int64_t n_tokens, int64_t n_logit_rows);

  /// Replaces the weights of tensor `name` with `values` (n_elements floats, GGUF layout),
  /// converted to the tensor's stored type (f32/f16/bf16 exactly as rounding allows, quantized
  /// types through the reference quantizer). For in-place weight updates between forward passes (RL
  /// rollout agents, docs/rl.md): not while a forward runs. On a host-visible device the model must
  /// have been loaded from an in-memory image (gguf_file::parse); a read-only file mapping is an
  /// `unsupported` error. Device-only devices get the converted tensor uploaded.
  status set_weight(std::string_view name, std::span<const float> values);

 private:
  model(gguf_file file, device& dev, const model_load_config& config);
  status bind_weights();
  result<tensor_view> weight(const std::string& name, int64_t n_cols, int64_t n_rows,
                             int64_t n_mats = 1, bool required = true);
  /// Gives `w` the device's packed copy where its matmul wants one (compute_ops::pack_weight):
  /// noted here, made by pack_all() at the end of bind_weights (`w` must stay where it is).
  status pack(tensor_view& w, const std::string& name);
  status pack_all();
  status ensure_buffers(int64_t n_tokens, int64_t n_logit_rows);
  status ffn_dense(const layer_weights& lw, int64_t n);
  status ffn_moe(const layer_weights& lw, int64_t n, int64_t layer, forward_output& out);
  float* buf(int i) const { return static_cast<float*>(bufs_[static_cast<size_t>(i)].data); }

  gguf_file file_;
  device& dev_;
  compute_ops& ops_;
  model_load_config config_;
  model_hparams hp_;
  tensor_view tok_embd_, output_norm_, output_;
  std::vector<layer_weights> layers_;
  std::vector<device_buffer> uploaded_;  ///< Weight copies on device-only devices, packed copies.
  std::vector<std::pair<std::string, void*>> uploaded_names_;  ///< Tensor name of each copy.
  std::vector<std::pair<std::string, tensor_view>> packed_;    ///< Weights with a packed copy.
  std::vector<std::pair<tensor_view*, std::string>> to_pack_;  ///< pack()'s, until pack_all().
  std::vector<std::byte> staging_;   ///< set_weight's converted tensor (device-only devices).
  std::vector<device_buffer> bufs_;  ///< Activations (see model.cpp for the index names).
  device_buffer ints_{};             ///< Token ids, positions, slots, block tables.
  int64_t buf_tokens_ = 0;
  int64_t logit_rows_ = 0;
  size_t ints_capacity_ = 0;
  int32_t* moe_ids_ = nullptr;  ///< Scratch index lists of the MoE FFN (inside ints_).
};

}  // namespace weft::gpu
