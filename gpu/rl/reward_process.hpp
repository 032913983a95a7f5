#pragma once
/// A user's reward function as an external process speaking JSON lines (docs/rl.md, "Rewards"): a
/// Python function is a reward. weft writes one request per line on the process's stdin,
///   {"id": 7, "prompt": "...", "completion": "...", "answer": "..."}
/// and reads one answer per request from its stdout, in any order,
///   {"id": 7, "reward": 0.5}
/// A process that exits or does not answer in time is killed, started again and sent the requests
/// it had not answered (a bounded number of times per batch); an answer that is not such a line —
/// not JSON, an unknown id, a reward that is not a finite number — fails the batch with an error
/// naming the sample, never a silent 0. Plain class, no CAF.

#include <sys/types.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gpu/status.hpp"

namespace weft::gpu::rl {

struct reward_request {
  std::string prompt;
  std::string completion;
  std::string answer;
};

struct reward_process_config {
  /// The command, run with /bin/sh -c (so "python3 my_reward.py --strict" works).
  std::string command;
  /// A batch's answers must all arrive within this many seconds of the (re)start of its requests.
  double timeout_s = 60.0;
  /// Restarts allowed per batch before the batch fails.
  int max_restarts = 3;
};

class reward_process {
 public:
  explicit reward_process(reward_process_config config);
  ~reward_process();
  reward_process(const reward_process&) = delete;
  reward_process& operator=(const reward_process&) = delete;

  /// The rewards of `items`, in order (ids are the items' indices).
  result<std::vector<double>> score(std::span<const reward_request> items);

  /// Times the process was (re)started since construction.
  int64_t starts() const { return starts_; }
  /// Restarts forced by a crash or a timeout since construction.
  int64_t restarts() const { return restarts_; }

 private:
  status start();
  void stop();
  /// One attempt: sends `pending` (indices into items) and collects answers into `out` until all
  /// came, the process died, or the deadline passed. Returns a fatal error (bad answer), or ok
  /// with `pending` reduced to what is still unanswered and `why` saying why the attempt ended
  /// early (empty when everything was answered).
  status attempt(std::span<const reward_request> items, std::vector<size_t>& pending,
                 std::vector<double>& out, std::vector<uint8_t>& have, std::string& why);

  reward_process_config config_;
  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  std::string buffer_;  ///< Bytes read from the child that do not end a line yet.
  int64_t starts_ = 0;
  int64_t restarts_ = 0;
};

}  // namespace weft::gpu::rl
