#pragma once
/// Supervised fine-tuning data (docs/training.md): JSON lines of `{"messages": [...]}` (rendered
/// with the model's chat template; only assistant turns are in the loss) or `{"prompt",
/// "completion"}` (only the completion and the end-of-sequence token are in the loss), tokenized
/// once; then a deterministic order from a seed and optimizer steps of a token budget split into
/// micro-batches. Plain classes, no CAF.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpu/chat_template.hpp"
#include "gpu/status.hpp"
#include "gpu/tokenizer.hpp"
#include "gpu/train/trainable_model.hpp"

namespace weft::gpu::train {

/// One tokenized example. in_loss[i] = 1 when tokens[i] is a token the model learns to produce.
struct sft_example {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> in_loss;
  int64_t line = 0;        ///< 1-based line in its file.
  bool truncated = false;  ///< Cut to sft_data_config::max_seq_tokens.
};

struct sft_data_config {
  /// Longer examples are cut to this many tokens (and counted in sft_dataset::truncated).
  int64_t max_seq_tokens = 2048;
};

struct sft_dataset {
  std::vector<sft_example> examples;
  int64_t truncated = 0;    ///< Examples cut to max_seq_tokens.
  int64_t tokens = 0;       ///< All tokens.
  int64_t loss_tokens = 0;  ///< Tokens in the loss.
};

/// Encodes one JSON line. `chat` renders `messages` lines (null: such lines are an error).
result<sft_example> encode_sft_line(std::string_view line, const tokenizer& tok,
                                    const chat_template* chat, const sft_data_config& config);

/// Reads and encodes every non-blank line of `path`. Bad lines make it fail with a message that
/// lists them (file:line: reason, the first 20); an example with no token in the loss is bad too.
result<sft_dataset> load_sft_jsonl(const std::filesystem::path& path, const tokenizer& tok,
                                   const chat_template* chat, const sft_data_config& config);

/// Where the data stands: epoch and index into that epoch's permutation. The whole data order
/// follows from (seed, cursor), so a checkpoint that stores the cursor resumes it exactly.
struct data_cursor {
  int64_t epoch = 0;
  int64_t index = 0;
  bool operator==(const data_cursor&) const = default;
};

/// Deals the examples out in optimizer steps: each epoch in a permutation drawn from
/// (seed, epoch); a step takes whole examples while their tokens fit `step_tokens` (at least one)
/// and ends at the end of an epoch (the last step of an epoch may be smaller; no example twice);
/// a step's examples are packed into micro-batches of at most `micro_batch_tokens` tokens.
class sft_sampler {
 public:
  sft_sampler(const sft_dataset& data, uint64_t seed, int64_t step_tokens,
              int64_t micro_batch_tokens);

  /// The micro-batches of the next step; advances the cursor.
  std::vector<train_batch> next_step();
  /// Rank `rank` of `world` data-parallel ranks: the micro-batches of its share of the next step
  /// (the step's examples split so that the ranks' token counts are balanced — longest first to
  /// the least-loaded rank — the same split on every rank); the whole step's token count in
  /// `step_tokens`. Advances the cursor like next_step().
  std::vector<train_batch> next_step(int rank, int world, int64_t* step_tokens);
  /// The step split into `total` balanced shares (the same split as above with world = total);
  /// returns shares first .. first + count - 1, each packed into micro-batches.
  std::vector<std::vector<train_batch>> next_step_shares(int first, int count, int total,
                                                         int64_t* step_tokens);

  const data_cursor& cursor() const { return cursor_; }
  void set_cursor(const data_cursor& c) { cursor_ = c; }

  /// The permutation of epoch `epoch`.
  std::vector<int64_t> permutation(int64_t epoch) const;

 private:
  const sft_dataset* data_;
  uint64_t seed_;
  int64_t step_tokens_;
  int64_t micro_tokens_;
  data_cursor cursor_;
  int64_t perm_epoch_ = -1;
  std::vector<int64_t> perm_;
};

}  // namespace weft::gpu::train
