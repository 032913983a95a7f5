#pragma once
/// Supervision policy as a plain class (no CAF): which children to restart when one fails, whether
/// the restart intensity allows it, and how long to back off. The supervisor actor and the
/// simulator run the same code.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace weft::actors {

/// Erlang/OTP restart strategies.
enum class restart_strategy {
  one_for_one,   ///< restart only the failed child (independent workers)
  one_for_all,   ///< restart every child (a gang sharing a collective)
  rest_for_one,  ///< restart the failed child and every child started after it (pipelines)
};

/// When a child is restarted (OTP's restart types).
enum class restart_type {
  permanent,  ///< always
  transient,  ///< only after an abnormal exit
  temporary,  ///< never
};

/// How a child ended.
enum class exit_kind { normal, abnormal };

/// At most `max_restarts` restarts within `window_ms`; one more makes the supervisor give up.
struct restart_intensity {
  uint32_t max_restarts = 5;
  uint64_t window_ms = 10'000;
};

/// Exponential backoff between consecutive restarts of the same child; reset after a child has run
/// for `reset_after_ms` without failing.
struct backoff_policy {
  uint64_t initial_ms = 20;
  uint64_t max_ms = 2'000;
  double multiplier = 2.0;
  uint64_t reset_after_ms = 5'000;
  /// Delay of the first restart in a row (0: at once). `weft serve` waits long enough for a killed
  /// node process to be relaunched, so that the worker is not stacked onto a surviving node.
  uint64_t first_delay_ms = 0;
};

restart_strategy parse_strategy(const std::string& name, bool* ok = nullptr);
const char* to_string(restart_strategy s);

/// The decision for one child failure.
struct restart_decision {
  bool give_up = false;            ///< intensity exceeded: stop restarting, escalate
  std::vector<size_t> to_restart;  ///< child indices, in start order
  uint64_t delay_ms = 0;           ///< backoff before restarting
};

/// Tracks restarts of one supervisor's children. Not thread-safe (owned by one actor).
class restart_tracker {
 public:
  restart_tracker(restart_strategy strategy, restart_intensity intensity, backoff_policy backoff);

  /// Decides what to do when child `index` (of `n_children`, in start order) exits with `how`,
  /// whose restart type is `type`, at time `now_ms`; `running_since_ms` is when it last started.
  restart_decision on_exit(size_t index, size_t n_children, restart_type type, exit_kind how,
                           uint64_t now_ms, uint64_t running_since_ms);

  /// Restarts counted in the current window.
  size_t restarts_in_window(uint64_t now_ms);

 private:
  restart_strategy strategy_;
  restart_intensity intensity_;
  backoff_policy backoff_;
  std::deque<uint64_t> restart_times_;
  std::vector<uint32_t> consecutive_failures_;
};

}  // namespace weft::actors
