#pragma once
/// Starting and watching child processes: `weft node` processes of a local cluster, benchmarks,
/// tests (weft::testing).

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "schema/status.hpp"

namespace weft::actors {

/// A child process whose stdout is a pipe the parent reads line by line.
class child_process {
 public:
  /// Starts `argv` (argv[0] = path) with extra environment `env` ("K=V").
  static result<child_process> start(const std::vector<std::string>& argv,
                                     const std::vector<std::string>& env = {});
  child_process(child_process&& other) noexcept;
  child_process& operator=(child_process&& other) noexcept;
  child_process(const child_process&) = delete;
  ~child_process();

  pid_t pid() const { return pid_; }
  /// Reads one line of the child's stdout, waiting at most `timeout_ms`; nullopt on timeout/EOF.
  std::optional<std::string> read_line(int timeout_ms);
  /// Sends `sig`.
  void signal(int sig) const;
  /// Non-blocking: true (and the exit status in `status`) once the child has ended.
  bool exited(int* status = nullptr);
  /// Sends SIGTERM, waits up to `grace_ms`, then SIGKILL; reaps the child.
  void stop(int grace_ms = 2000);

 private:
  child_process() = default;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  bool reaped_ = false;
  std::string buffer_;
};

/// Path of the running executable.
std::string self_exe();

}  // namespace weft::actors
