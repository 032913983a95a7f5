#include "gpu/rl/json_lines_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>

extern char** environ;

namespace weft::gpu::rl {

namespace {

std::string exit_text(int st) {
  if (WIFEXITED(st)) return "exited with status " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return "was killed by signal " + std::to_string(WTERMSIG(st));
  return "stopped";
}

std::string clip(const std::string& s) {
  return s.size() <= 200 ? s : s.substr(0, 200) + "...";
}

}  // namespace

json_lines_process::json_lines_process(json_lines_config config) : config_(std::move(config)) {
  // A write to a process that just died must be an EPIPE error, not a fatal signal.
  std::signal(SIGPIPE, SIG_IGN);
}

json_lines_process::~json_lines_process() {
  stop();
}

status json_lines_process::start() {
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0)
    return {status_code::internal, "pipe: " + std::string(std::strerror(errno))};
  if (::pipe2(out, O_CLOEXEC) != 0) {
    ::close(in[0]);
    ::close(in[1]);
    return {status_code::internal, "pipe: " + std::string(std::strerror(errno))};
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  // Its own process group: killing it kills whatever the shell started too.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  const char* argv[] = {"/bin/sh", "-c", config_.command.c_str(), nullptr};
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, "/bin/sh", &fa, &attr, const_cast<char* const*>(argv), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&fa);
  ::close(in[0]);
  ::close(out[1]);
  if (rc != 0) {
    ::close(in[1]);
    ::close(out[0]);
    return {status_code::internal,
            "cannot start " + config_.name + ": " + std::string(std::strerror(rc))};
  }
  pid_ = pid;
  to_child_ = in[1];
  from_child_ = out[0];
  ::fcntl(to_child_, F_SETFL, ::fcntl(to_child_, F_GETFL) | O_NONBLOCK);
  ::fcntl(from_child_, F_SETFL, ::fcntl(from_child_, F_GETFL) | O_NONBLOCK);
  buffer_.clear();
  ++starts_;
  return {};
}

void json_lines_process::stop() {
  if (to_child_ >= 0) ::close(to_child_);
  if (from_child_ >= 0) ::close(from_child_);
  to_child_ = from_child_ = -1;
  if (pid_ > 0) {
    ::kill(-pid_, SIGKILL);  // the group: the shell and what it started
    int st = 0;
    ::waitpid(pid_, &st, 0);
  }
  pid_ = -1;
}

status json_lines_process::attempt(const std::vector<nlohmann::json>& requests,
                                   std::vector<size_t>& pending, std::vector<nlohmann::json>& out,
                                   std::vector<uint8_t>& have, const answer_check& check,
                                   std::string& why) {
  std::string outgoing;
  for (size_t i : pending) {
    outgoing += requests[i].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    outgoing += '\n';
  }
  size_t written = 0;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(config_.timeout_s));
  size_t answered = 0;
  const size_t wanted = pending.size();
  while (answered < wanted) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      why = "no answer within " + std::to_string(config_.timeout_s) + " s";
      break;
    }
    pollfd fds[2] = {{from_child_, POLLIN, 0}, {to_child_, POLLOUT, 0}};
    const nfds_t n = written < outgoing.size() ? 2 : 1;
    const int rc = ::poll(fds, n, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (rc < 0 && errno != EINTR)
      return {status_code::internal, "poll: " + std::string(std::strerror(errno))};
    if (n == 2 && (fds[1].revents & (POLLOUT | POLLERR | POLLHUP)) != 0) {
      const ssize_t w = ::write(to_child_, outgoing.data() + written, outgoing.size() - written);
      if (w > 0) {
        written += static_cast<size_t>(w);
      } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
        why = "its stdin closed (" + std::string(std::strerror(errno)) + ")";
        break;
      }
    }
    if ((fds[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      char buf[65536];
      const ssize_t r = ::read(from_child_, buf, sizeof buf);
      if (r == 0) {
        why = "it closed its stdout";
        break;
      }
      if (r < 0) {
        if (errno == EAGAIN || errno == EINTR) continue;
        why = "reading its stdout failed (" + std::string(std::strerror(errno)) + ")";
        break;
      }
      buffer_.append(buf, static_cast<size_t>(r));
      size_t nl;
      while ((nl = buffer_.find('\n')) != std::string::npos) {
        const std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        auto j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object() || !j.contains("id") ||
            !j["id"].is_number_integer()) {
          return {status_code::invalid_argument, config_.name + " answered a line that is not " +
                                                     config_.answer_shape + ": '" + clip(line) +
                                                     "'"};
        }
        const auto id = j["id"].get<int64_t>();
        if (id < 0 || static_cast<size_t>(id) >= requests.size()) {
          return {status_code::invalid_argument,
                  config_.name + " answered for unknown id " + std::to_string(id)};
        }
        if (auto bad = check(static_cast<size_t>(id), j); !bad.empty()) {
          return {status_code::invalid_argument, bad + ": '" + clip(line) + "'"};
        }
        if (have[static_cast<size_t>(id)] == 0) {
          have[static_cast<size_t>(id)] = 1;
          out[static_cast<size_t>(id)] = std::move(j);
          ++answered;
        }
      }
    }
  }
  std::vector<size_t> still;
  for (size_t i : pending) {
    if (have[i] == 0) still.push_back(i);
  }
  pending = std::move(still);
  return {};
}

result<std::vector<nlohmann::json>> json_lines_process::exchange(
    std::vector<nlohmann::json> requests, const answer_check& check) {
  for (size_t i = 0; i < requests.size(); ++i) requests[i]["id"] = i;
  std::vector<nlohmann::json> out(requests.size());
  std::vector<uint8_t> have(requests.size(), 0);
  std::vector<size_t> pending(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) pending[i] = i;
  int restarts = 0;
  while (!pending.empty()) {
    if (pid_ <= 0) {
      if (auto st = start(); !st) return st;
    }
    std::string why;
    if (auto st = attempt(requests, pending, out, have, check, why); !st) {
      stop();  // the process's state is unknown after a bad answer
      return st;
    }
    if (pending.empty()) break;
    // It died or hung: say why, kill it and send what is unanswered to a new one.
    // A process that closed its pipes is (about to be) gone: give it a moment to be reaped so
    // the message can say how it ended.
    int st = 0;
    std::string exit_why;
    for (int i = 0; i < 100 && pid_ > 0; ++i) {
      siginfo_t info{};
      if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
          info.si_pid == pid_) {
        // Exited, not reaped yet (so its group id cannot be reused): kill what it left behind,
        // then reap it.
        ::kill(-pid_, SIGKILL);
        ::waitpid(pid_, &st, 0);
        exit_why = " (it " + exit_text(st) + ")";
        pid_ = -1;
        break;
      }
      if (why.rfind("no answer", 0) == 0) break;  // hung: it is still running
      ::usleep(10'000);
    }
    stop();
    if (restarts == config_.max_restarts) {
      return status{status_code::internal,
                    config_.name + " failed " + std::to_string(restarts + 1) +
                        " time(s) in one batch; last: " + why + exit_why + "; " +
                        std::to_string(pending.size()) + " request(s) unanswered"};
    }
    ++restarts;
    ++restarts_;
    spdlog::warn("{}: {}{}; restarting it and re-sending {} request(s)", config_.name, why,
                 exit_why, pending.size());
  }
  return out;
}

}  // namespace weft::gpu::rl
