#include "apps/process_control.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace weft::apps {

namespace {

// Self-pipe: the handler may run on any thread (libraries such as OpenBLAS start threads before
// main, so blocking signals in main cannot cover every thread); it only writes the signal number.
int signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = ::write(signal_pipe[1], &b, 1);
}

}  // namespace

stop_latch& stop_latch::instance() {
  static stop_latch latch;
  return latch;
}

void stop_latch::catch_signals() {
  if (signal_pipe[0] >= 0) return;
  if (::pipe2(signal_pipe, O_CLOEXEC) != 0) return;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  // Installing a handler also overrides an inherited "ignore" (shells start background jobs with
  // SIGINT ignored).
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  std::thread([this] {
    unsigned char b = 0;
    ssize_t n = 0;
    // Retry only an interrupted read; any other failure ends the wait instead of spinning.
    while ((n = ::read(signal_pipe[0], &b, 1)) < 0 && errno == EINTR) {
    }
    if (n != 1) {
      spdlog::error("signal pipe: read failed ({}); stopping",
                    n < 0 ? std::strerror(errno) : "EOF");
      request(1);
      return;
    }
    int sig = b;
    request(sig == SIGINT || sig == SIGTERM ? 0 : 128 + sig);
  }).detach();
}

void stop_latch::request(int exit_code) {
  std::lock_guard<std::mutex> guard(mu_);
  if (requested_.exchange(true)) return;
  code_ = exit_code;
  cv_.notify_all();
}

int stop_latch::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return requested_.load(); });
  return code_;
}

void exit_with_parent_if_asked() {
  const char* flag = std::getenv("WEFT_EXIT_WITH_PARENT");
  if (flag == nullptr || *flag == '\0' || *flag == '0') return;
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  // The parent may have died before prctl took effect.
  if (::getppid() == 1) std::_Exit(3);
}

}  // namespace weft::apps
