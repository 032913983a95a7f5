#include "gpu/rl/reward_process.hpp"

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

reward_process::reward_process(reward_process_config config) : config_(std::move(config)) {
  // A write to a process that just died must be an EPIPE error, not a fatal signal.
  std::signal(SIGPIPE, SIG_IGN);
}

reward_process::~reward_process() {
  stop();
}

status reward_process::start() {
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
            "cannot start the reward command: " + std::string(std::strerror(rc))};
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

void reward_process::stop() {
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

status reward_process::attempt(std::span<const reward_request> items, std::vector<size_t>& pending,
                               std::vector<double>& out, std::vector<uint8_t>& have,
                               std::string& why) {
  std::string outgoing;
  for (size_t i : pending) {
    const nlohmann::json j = {{"id", i},
                              {"prompt", items[i].prompt},
                              {"completion", items[i].completion},
                              {"answer", items[i].answer}};
    outgoing += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
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
          return {status_code::invalid_argument,
                  "the reward process answered a line that is not {\"id\": N, \"reward\": X}: '" +
                      clip(line) + "'"};
        }
        const auto id = j["id"].get<int64_t>();
        if (id < 0 || static_cast<size_t>(id) >= items.size()) {
          return {status_code::invalid_argument,
                  "the reward process answered for unknown sample id " + std::to_string(id)};
        }
        const std::string who = "sample " + std::to_string(id) + " (completion '" +
                                clip(items[static_cast<size_t>(id)].completion) + "')";
        if (!j.contains("reward") || !j["reward"].is_number() ||
            !std::isfinite(j["reward"].get<double>())) {
          return {status_code::invalid_argument,
                  "the reward process gave " + who + " no finite reward: '" + clip(line) + "'"};
        }
        if (have[static_cast<size_t>(id)] == 0) {
          have[static_cast<size_t>(id)] = 1;
          out[static_cast<size_t>(id)] = j["reward"].get<double>();
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

result<std::vector<double>> reward_process::score(std::span<const reward_request> items) {
  std::vector<double> out(items.size(), 0.0);
  std::vector<uint8_t> have(items.size(), 0);
  std::vector<size_t> pending(items.size());
  for (size_t i = 0; i < items.size(); ++i) pending[i] = i;
  int restarts = 0;
  while (!pending.empty()) {
    if (pid_ <= 0) {
      if (auto st = start(); !st) return st;
    }
    std::string why;
    if (auto st = attempt(items, pending, out, have, why); !st) {
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
                    "the reward process failed " + std::to_string(restarts + 1) +
                        " time(s) in one batch; last: " + why + exit_why + "; " +
                        std::to_string(pending.size()) + " sample(s) unscored"};
    }
    ++restarts;
    ++restarts_;
    spdlog::warn("reward process: {}{}; restarting it and re-sending {} sample(s)", why, exit_why,
                 pending.size());
  }
  return out;
}

}  // namespace weft::gpu::rl
