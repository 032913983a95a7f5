#pragma once
/// How long an engine worker may go without finishing a step before the router calls it hung.
///
/// A fixed `--stall-ms` is wrong on a slow host: one pass of `--idle-batch-tokens` = 512 prompt
/// tokens takes ~7 s on one core of a Zen 1 EPYC (74 prompt tok/s), and twice that while the
/// other worker computes on the same two cores, so a healthy prefill worker went 14 s without a
/// step and was killed as hung (then again after its restart). The worker therefore measures its
/// own steps and reports how long its longest step should take (`step_history::bound_ms`), and the
/// router waits `stall_step_multiple` times that before it calls a worker hung, and never less
/// than `--stall-ms` (docs/serving.md, "Hung workers").
///
/// Plain C++ (no CAF): the worker and the router each own one piece; tests drive them directly.

#include <cstdint>
#include <deque>

namespace weft::serve {

/// How many times its own step bound a worker may go without a step before it is hung.
inline constexpr uint32_t stall_step_multiple = 4;

/// The largest step bound the router believes (a worker reporting more, by a bug or on purpose,
/// must not switch hung detection off for every worker): 10 minutes.
inline constexpr uint32_t max_step_bound_ms = 600'000;

/// Worker side: durations of its recent engine steps.
class step_history {
 public:
  /// A step older than this no longer counts as the slowest (one old outlier is not the bound).
  static constexpr uint64_t window_ms = 120'000;
  /// Steps with at least this many tokens give the per-token cost (a few decode tokens do not).
  static constexpr int64_t min_rate_tokens = 16;

  /// Weight of a new per-token sample in the running average.
  static constexpr double rate_weight = 0.1;

  /// One finished step at `now_ms`: its wall time and the tokens it computed (prompt + decode).
  void record(double ms, int64_t tokens, uint64_t now_ms);

  /// The longest a step of up to `max_step_tokens` tokens should take on this worker: the
  /// slowest step of the last window, or `max_step_tokens` times the average per-token time of
  /// steps with `min_rate_tokens` or more (kept however long ago they ran: a worker that has only
  /// decoded a few sequences lately is no faster at a full prompt pass), whichever is longer.
  /// 0 before any step.
  [[nodiscard]] uint32_t bound_ms(int64_t max_step_tokens, uint64_t now_ms) const;

 private:
  struct sample {
    uint64_t at_ms;
    double ms;
  };
  /// The window's steps as a sliding maximum: durations decrease from front to back.
  std::deque<sample> slowest_;
  double ms_per_token_ = 0.0;  ///< running average; 0 before the first large step
};

/// Router side: how long (ms) a worker may go without a step or a load report. `stall_ms` is the
/// configured floor; `bound_ms` the largest step bound the router has seen from workers (a
/// restarted worker has measured nothing yet, so the router keeps what its predecessor and the
/// others reported), believed up to max_step_bound_ms.
[[nodiscard]] uint64_t stall_limit_ms(uint64_t stall_ms, uint32_t bound_ms);

}  // namespace weft::serve
