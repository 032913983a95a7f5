#include "apps/process_control.hpp"

#include <csignal>
#include <pthread.h>

#include <thread>

namespace weft::apps {

stop_latch& stop_latch::instance() {
  static stop_latch latch;
  return latch;
}

void stop_latch::block_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([this, set] {
    int sig = 0;
    sigwait(&set, &sig);
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

}  // namespace weft::apps
