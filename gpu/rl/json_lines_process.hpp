#pragma once
/// A user's program speaking JSON lines on stdin/stdout (docs/rl.md): what runs a reward function
/// (`--reward-cmd`, reward_process.hpp) and a tool of your own (`--tool-cmd`, tools.hpp). weft
/// writes one request object per line, each with an integer "id", and reads one answer object per
/// request, in any order, with the same "id". A program that exits or does not answer in time is
/// killed, started again and sent the requests it had not answered (a bounded number of times per
/// exchange); a line that is not such an answer fails the exchange with an error, never a guess.
/// Plain class, no CAF.

#include <sys/types.h>

#include <nlohmann/json_fwd.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gpu/status.hpp"

namespace weft::gpu::rl {

struct json_lines_config {
  /// The command, run with /bin/sh -c (so "python3 my_reward.py --strict" works).
  std::string command;
  /// An exchange's answers must all arrive within this many seconds of the (re)start of its
  /// requests.
  double timeout_s = 60.0;
  /// Restarts allowed per exchange before it fails.
  int max_restarts = 3;
  /// How messages name the program ("the reward process") and the answer it owes
  /// ("{\"id\": N, \"reward\": X}").
  std::string name = "the process";
  std::string answer_shape = "{\"id\": N, ...}";
};

class json_lines_process {
 public:
  explicit json_lines_process(json_lines_config config);
  ~json_lines_process();
  json_lines_process(const json_lines_process&) = delete;
  json_lines_process& operator=(const json_lines_process&) = delete;

  /// Checks the answer to request `index`: an empty string when it is good, else what is wrong
  /// (the exchange fails with it).
  using answer_check = std::function<std::string(size_t index, const nlohmann::json& answer)>;

  /// Sends `requests` (objects; their "id" is set to their index) and returns the answer to each,
  /// in order.
  result<std::vector<nlohmann::json>> exchange(std::vector<nlohmann::json> requests,
                                               const answer_check& check);

  /// Times the program was (re)started since construction (any thread).
  int64_t starts() const { return starts_.load(std::memory_order_relaxed); }
  /// Restarts forced by a crash or a timeout since construction (any thread).
  int64_t restarts() const { return restarts_.load(std::memory_order_relaxed); }

 private:
  status start();
  void stop();
  /// One attempt: sends `pending` and collects answers until all came, the program died, or the
  /// deadline passed. Returns a fatal error (bad answer), or ok with `pending` reduced to what is
  /// still unanswered and `why` saying why the attempt ended early (empty when all answered).
  status attempt(const std::vector<nlohmann::json>& requests, std::vector<size_t>& pending,
                 std::vector<nlohmann::json>& out, std::vector<uint8_t>& have,
                 const answer_check& check, std::string& why);

  json_lines_config config_;
  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  std::string buffer_;  ///< Bytes read from the child that do not end a line yet.
  std::atomic<int64_t> starts_{0};
  std::atomic<int64_t> restarts_{0};
};

}  // namespace weft::gpu::rl
