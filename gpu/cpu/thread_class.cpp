#include "gpu/cpu/thread_class.hpp"

#include <sched.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

namespace weft::gpu::cpu {

namespace {

// Set once enter_helper_class moved a thread of this process to SCHED_BATCH.
std::atomic<bool> helpers_batched{false};

}  // namespace

bool parse_helper_sched(const std::string& text, helper_sched& out) {
  if (text == "batch") {
    out = helper_sched::batch;
    return true;
  }
  if (text == "normal") {
    out = helper_sched::normal;
    return true;
  }
  return false;
}

std::string enter_helper_class(helper_sched s) {
  if (s == helper_sched::normal) return {};
  const int policy = sched_getscheduler(0);
  if (policy != SCHED_OTHER && policy != SCHED_BATCH) {
    // A real-time or idle policy set from outside (chrt): kept for every thread.
    return "the process runs under scheduling policy " + std::to_string(policy) + ", left as it is";
  }
  // SCHED_BATCH already: inherited from the weft process that started this one (a node of
  // `weft serve`), or set by the user; either way the compute threads leave it.
  sched_param p{};
  p.sched_priority = 0;
  if (policy == SCHED_OTHER && sched_setscheduler(0, SCHED_BATCH, &p) != 0) {
    return std::string("sched_setscheduler(SCHED_BATCH): ") + std::strerror(errno);
  }
  helpers_batched.store(true, std::memory_order_release);
  return {};
}

void enter_compute_class() {
  thread_local bool done = false;
  if (done || !helpers_batched.load(std::memory_order_acquire)) return;
  done = true;
  if (sched_getscheduler(0) != SCHED_BATCH) return;
  sched_param p{};
  p.sched_priority = 0;
  sched_setscheduler(0, SCHED_OTHER, &p);
}

}  // namespace weft::gpu::cpu
