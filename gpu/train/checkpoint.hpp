#pragma once
/// Exact training checkpoints (docs/training.md): parameters, AdamW moments, step, data cursor,
/// seed and the loss history, in one checksummed file per step, written atomically (temporary
/// file, fsync, rename) and — through async_checkpointer — in the background from a host snapshot
/// (MegaScale's two-stage checkpoint). A corrupt or truncated file is refused with a message naming
/// it; load_latest_checkpoint then falls back to the previous good one.

#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "gpu/status.hpp"
#include "gpu/train/optimizer.hpp"
#include "gpu/train/sft_data.hpp"

namespace weft::gpu::train {

/// One row of the loss curve.
struct step_record {
  int64_t step = 0;  ///< 1-based update number.
  double loss = 0.0;
  double lr = 0.0;
  double grad_norm = 0.0;
  int64_t tokens = 0;
  bool operator==(const step_record&) const = default;
};

/// Everything a run needs to continue bit for bit.
struct checkpoint_state {
  int64_t step = 0;  ///< Updates done.
  data_cursor cursor;
  uint64_t seed = 0;
  int64_t adam_steps = 0;
  lr_schedule schedule;  ///< The schedule the run had (a resume with another one is told).
  std::vector<std::string> names;
  std::vector<std::vector<float>> values, m, v;
  std::vector<step_record> history;
};

/// A checkpoint's contents with the tensors borrowed — from a checkpoint_state (view_of), or from
/// the live parameters and optimizer (borrow_parameters: a checkpoint written from it copies
/// nothing, as the last one of a run, which need not let training go on while it is written).
struct checkpoint_view {
  int64_t step = 0;
  data_cursor cursor;
  uint64_t seed = 0;
  int64_t adam_steps = 0;
  lr_schedule schedule;
  std::vector<std::string_view> names;
  std::vector<std::span<const float>> values, m, v;
  std::span<const step_record> history;
};

/// `s` as a view (borrowing all of it).
checkpoint_view view_of(const checkpoint_state& s);
/// `meta`'s step, cursor, seed, schedule and history with the live values and moments of
/// `params` and `opt` (valid while none of them changes).
checkpoint_view borrow_parameters(const checkpoint_state& meta,
                                  const std::vector<parameter<float>>& params, const adamw& opt);

/// Copies the parameters' values and the optimizer's moments and step count into `s` (names,
/// values, m, v, adam_steps), reusing its buffers.
void snapshot_parameters(const std::vector<parameter<float>>& params, const adamw& opt,
                         checkpoint_state& s);
/// The reverse, after checking that the checkpoint's tensors are the model's (names and sizes).
status restore_parameters(const checkpoint_state& s, std::vector<parameter<float>>& params,
                          adamw& opt);

/// `dir`/step-00000042.ckpt
std::filesystem::path checkpoint_path(const std::filesystem::path& dir, int64_t step);

/// Writes the state atomically (a reader sees the old file set or the new file, never a part).
status write_checkpoint(const std::filesystem::path& dir, const checkpoint_state& state);
status write_checkpoint(const std::filesystem::path& dir, const checkpoint_view& state);

/// Reads and verifies one checkpoint file (magic, version, sizes, checksum).
result<checkpoint_state> read_checkpoint(const std::filesystem::path& file);

/// The newest checkpoint in `dir` that verifies; every newer one that does not is named in
/// `skipped` (file: reason). not_found when the directory has no usable checkpoint.
result<checkpoint_state> load_latest_checkpoint(const std::filesystem::path& dir,
                                                std::vector<std::string>* skipped = nullptr);

/// Removes all but the newest `keep` checkpoints of `dir`.
void prune_checkpoints(const std::filesystem::path& dir, int keep);

/// Writes checkpoints on a background thread from a staging copy in host memory (MegaScale's
/// two-stage checkpoint): `save` waits for the previous write, has `fill` copy the state into the
/// staging buffer — reused from save to save, so after the first no memory is allocated or faulted
/// in — and returns while the file is written.
class async_checkpointer {
 public:
  async_checkpointer(std::filesystem::path dir, int keep);
  ~async_checkpointer();
  async_checkpointer(const async_checkpointer&) = delete;
  async_checkpointer& operator=(const async_checkpointer&) = delete;

  /// Copies the state in through `fill` and starts writing it; returns `fill`'s error (nothing is
  /// written then) or the error of the previous write, if it failed.
  status save(const std::function<status(checkpoint_state&)>& fill);
  /// The same with a state already made.
  status save(checkpoint_state state);
  /// Waits for the pending write; returns its outcome.
  status wait();
  /// Waits for the pending write, then writes `state` on the caller's thread (no staging copy:
  /// a run's last checkpoint, or the one on SIGTERM); the first error of the two.
  status write_now(const checkpoint_view& state);

 private:
  void run();

  std::filesystem::path dir_;
  int keep_;
  std::mutex mu_;
  std::condition_variable cv_;
  checkpoint_state staging_;
  bool pending_ = false;
  bool busy_ = false;
  bool stop_ = false;
  status last_;
  std::thread thread_;
};

/// A checkpoint of `source` (an sft_trainer or a grpo_loop: snapshot_into and live_checkpoint): in
/// the background from a staging copy, or — `wait`, when nothing trains meanwhile — written now
/// from its live tensors.
template <class Source>
status checkpoint_of(async_checkpointer& ckpt, Source& source, bool wait) {
  if (!wait) return ckpt.save([&](checkpoint_state& s) { return source.snapshot_into(s); });
  checkpoint_state meta;
  auto view = source.live_checkpoint(meta);
  if (!view) return view.error();
  return ckpt.write_now(*view);
}

}  // namespace weft::gpu::train
