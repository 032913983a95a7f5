// The fault-injecting decorator.
//
// Every intercepted transfer gets an outer transfer_state (the user's) and, once started, an
// inner transfer on the wrapped engine whose callback finishes the outer one. Dropped, failed and
// delayed transfers are driven by a small timer queue, run from progress() and, in
// progress_mode::thread, from the decorator's own timer thread.
// Locking: mutex_ guards the rng, counters, timers and table; it is never held while calling
// the inner engine or a user callback.

#include "transport/fault_injection.hpp"

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

namespace weft::transport {

namespace {

status check_policy(const fault_policy& p) {
  auto prob_ok = [](double v) { return v >= 0.0 && v <= 1.0; };
  if (!prob_ok(p.drop_probability) || !prob_ok(p.corrupt_probability)) {
    return make_status(status_code::invalid_argument,
                       "fault policy: probabilities must be in [0, 1]");
  }
  if (p.fail_after_n < -1) {
    return make_status(status_code::invalid_argument, "fault policy: fail_after_n must be >= -1");
  }
  return ok_status();
}

template <class T>
bool parse_number(const std::string& s, T& out) {
  if constexpr (std::is_floating_point_v<T>) {
    try {
      std::size_t used = 0;
      out = static_cast<T>(std::stod(s, &used));
      return used == s.size();
    } catch (...) {
      return false;
    }
  } else {
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc{} && ptr == s.data() + s.size();
  }
}

}  // namespace

result<fault_policy> parse_fault_policy(const std::map<std::string, std::string>& params) {
  fault_policy p;
  for (const auto& [key, value] : params) {
    if (key.rfind("fault.", 0) != 0) continue;
    bool ok = false;
    if (key == "fault.drop_probability")
      ok = parse_number(value, p.drop_probability);
    else if (key == "fault.delay_ms")
      ok = parse_number(value, p.delay_ms);
    else if (key == "fault.fail_after_n")
      ok = parse_number(value, p.fail_after_n);
    else if (key == "fault.corrupt_probability")
      ok = parse_number(value, p.corrupt_probability);
    else if (key == "fault.seed")
      ok = parse_number(value, p.seed);
    else if (key == "fault.batches")
      ok = (value == "true" || value == "false") && ((p.batches = value == "true"), true);
    else
      return make_status(status_code::invalid_argument, "unknown fault param '" + key + "'");
    if (!ok) {
      return make_status(status_code::invalid_argument,
                         "fault param " + key + ": cannot parse '" + value + "'");
    }
  }
  status s = check_policy(p);
  if (!s.ok()) return s;
  return p;
}

struct fault_injecting_engine::impl {
  // A transfer the decorator knows about.
  struct entry {
    std::shared_ptr<transfer_state> outer;
    transfer inner;
  };

  // How to start one transfer on the inner engine, and where a corruption would land.
  struct launch_plan {
    std::function<result<transfer>(completion_fn, std::uint32_t timeout_ms)> start;
    corrupt_side side = corrupt_side::destination;
    std::byte* bytes = nullptr;  // host bytes of the side to corrupt (nullptr: cannot corrupt)
    std::size_t size_bytes = 0;
    std::uint32_t timeout_ms = 0;
  };

  std::mutex mutex;
  std::condition_variable cv;
  fault_policy policy;
  fault_stats counters;
  std::mt19937_64 rng;
  std::multimap<clock::time_point, std::function<void()>> timers;
  std::unordered_map<std::uint64_t, entry> entries;
  bool stop = false;
  std::thread timer_thread;

  result<transfer> inject(launch_plan plan, completion_fn on_done);

  double uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng); }

  // Runs due timers; returns how many ran.
  std::size_t run_timers() {
    std::vector<std::function<void()>> due;
    {
      std::lock_guard<std::mutex> lock(mutex);
      auto now = clock::now();
      while (!timers.empty() && timers.begin()->first <= now) {
        due.push_back(std::move(timers.begin()->second));
        timers.erase(timers.begin());
      }
    }
    for (auto& f : due) f();
    return due.size();
  }

  void add_timer(clock::time_point at, std::function<void()> f) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      timers.emplace(at, std::move(f));
    }
    cv.notify_all();
  }

  void finish(const std::shared_ptr<transfer_state>& outer, completion c) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      entries.erase(outer->id());
    }
    outer->finish(std::move(c));
  }

  void timer_loop() {
    std::unique_lock<std::mutex> lock(mutex);
    while (!stop) {
      if (!timers.empty() && timers.begin()->first <= clock::now()) {
        lock.unlock();
        run_timers();
        lock.lock();
        continue;
      }
      if (timers.empty()) {
        cv.wait(lock);
      } else {
        cv.wait_until(lock, timers.begin()->first);
      }
    }
  }
};

fault_injecting_engine::fault_injecting_engine(std::unique_ptr<engine> inner,
                                               const fault_policy& policy)
    : inner_(std::move(inner)), impl_(std::make_unique<impl>()) {
  set_policy(policy);
  if (inner_->mode() == progress_mode::thread) {
    impl_->timer_thread = std::thread([this] { impl_->timer_loop(); });
  }
}

fault_injecting_engine::~fault_injecting_engine() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->timer_thread.joinable()) impl_->timer_thread.join();
  // Transfers waiting in the timer queue (dropped, delayed) never reached the inner engine.
  std::vector<std::shared_ptr<transfer_state>> pending;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    for (auto& [id, e] : impl_->entries) {
      if (!e.inner.valid()) pending.push_back(e.outer);
    }
  }
  for (auto& s : pending) {
    s->finish(completion{make_status(status_code::canceled, "engine shut down"), 0, 0});
  }
  inner_.reset();  // completes the started ones with canceled
}

status fault_injecting_engine::set_policy(const fault_policy& policy) {
  status s = check_policy(policy);
  fault_policy p = policy;
  p.drop_probability = std::clamp(p.drop_probability, 0.0, 1.0);
  p.corrupt_probability = std::clamp(p.corrupt_probability, 0.0, 1.0);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->policy = p;
  impl_->rng.seed(p.seed);
  return s;
}

fault_stats fault_injecting_engine::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->counters;
}

capabilities fault_injecting_engine::caps() const {
  capabilities c = inner_->caps();
  c.name = "fault:" + c.name;
  return c;
}

// -- pass-through -----------------------------------------------------------------------------

result<region> fault_injecting_engine::register_memory(void* data, std::size_t size_bytes,
                                                       memory_kind kind) {
  return inner_->register_memory(data, size_bytes, kind);
}
result<region> fault_injecting_engine::allocate_memory(std::size_t size_bytes, memory_kind kind) {
  return inner_->allocate_memory(size_bytes, kind);
}
status fault_injecting_engine::release_memory(const region& r) {
  return inner_->release_memory(r);
}
result<bytes> fault_injecting_engine::describe(const region& r) {
  return inner_->describe(r);
}
result<bytes> fault_injecting_engine::local_address() {
  return inner_->local_address();
}
result<peer_handle> fault_injecting_engine::connect(std::span<const std::byte> address) {
  return inner_->connect(address);
}
status fault_injecting_engine::disconnect(peer_handle peer) {
  return inner_->disconnect(peer);
}
result<remote_region> fault_injecting_engine::import_remote(peer_handle peer,
                                                            std::span<const std::byte> d) {
  return inner_->import_remote(peer, d);
}
status fault_injecting_engine::release_remote(remote_region remote) {
  return inner_->release_remote(remote);
}
progress_mode fault_injecting_engine::mode() const {
  return inner_->mode();
}

std::size_t fault_injecting_engine::progress() {
  return inner_->progress() + impl_->run_timers();
}

// -- injection --------------------------------------------------------------------------------

namespace {

enum class fault_kind { none, drop, fail };

}  // namespace

namespace {

/// The host bytes a corruption may flip: [data + offset, + size) of a host region, else none.
std::pair<std::byte*, std::size_t> host_bytes(const region& r, std::size_t offset_bytes,
                                              std::size_t size_bytes) {
  if (r.kind != memory_kind::host || r.data == nullptr) return {nullptr, 0};
  return {r.data + offset_bytes, size_bytes};
}

/// A batch is corrupted in its first segment.
std::pair<std::byte*, std::size_t> host_bytes(const rma_batch_request& rq) {
  if (rq.segments.empty()) return {nullptr, 0};
  const auto& s = rq.segments[0];
  return host_bytes(s.local, s.local_offset_bytes, s.size_bytes);
}

}  // namespace

/// Forwards `rq` to `(inner.*start)` through the injector. `side` is where a corruption lands and
/// `bytes` the host bytes of that side (none: the request cannot be corrupted).
template <class Request>
result<transfer> fault_injecting_engine::forward(
    const Request& rq, result<transfer> (engine::*start)(const Request&, completion_fn),
    corrupt_side side, std::pair<std::byte*, std::size_t> bytes, completion_fn on_done) {
  impl::launch_plan plan;
  plan.start = [this, rq, start](completion_fn f, std::uint32_t timeout_ms) {
    auto r = rq;
    r.options.timeout_ms = timeout_ms;
    return (inner_.get()->*start)(r, std::move(f));
  };
  plan.side = side;
  plan.bytes = bytes.first;
  plan.size_bytes = bytes.second;
  plan.timeout_ms = rq.options.timeout_ms;
  return impl_->inject(std::move(plan), std::move(on_done));
}

result<transfer> fault_injecting_engine::put(const rma_request& rq, completion_fn on_done) {
  return forward(rq, &engine::put, corrupt_side::source,
                 host_bytes(rq.local, rq.local_offset_bytes, rq.size_bytes), std::move(on_done));
}

result<transfer> fault_injecting_engine::get(const rma_request& rq, completion_fn on_done) {
  return forward(rq, &engine::get, corrupt_side::destination,
                 host_bytes(rq.local, rq.local_offset_bytes, rq.size_bytes), std::move(on_done));
}

bool fault_injecting_engine::batches_enabled() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->policy.batches;
}

result<transfer> fault_injecting_engine::put_batch(const rma_batch_request& rq,
                                                   completion_fn on_done) {
  if (!batches_enabled()) {
    return make_status(status_code::unsupported, "put_batch: batches are off (fault.batches)");
  }
  return forward(rq, &engine::put_batch, corrupt_side::source, host_bytes(rq), std::move(on_done));
}

result<transfer> fault_injecting_engine::get_batch(const rma_batch_request& rq,
                                                   completion_fn on_done) {
  if (!batches_enabled()) {
    return make_status(status_code::unsupported, "get_batch: batches are off (fault.batches)");
  }
  return forward(rq, &engine::get_batch, corrupt_side::destination, host_bytes(rq),
                 std::move(on_done));
}

result<transfer> fault_injecting_engine::send(const send_request& rq, completion_fn on_done) {
  return forward(rq, &engine::send, corrupt_side::source,
                 host_bytes(rq.local, rq.offset_bytes, rq.size_bytes), std::move(on_done));
}

result<transfer> fault_injecting_engine::recv(const recv_request& rq, completion_fn on_done) {
  // Clipped to the received size on completion.
  return forward(rq, &engine::recv, corrupt_side::destination,
                 host_bytes(rq.local, rq.offset_bytes, rq.size_bytes), std::move(on_done));
}

result<transfer> fault_injecting_engine::broadcast(const collective_request& rq,
                                                   completion_fn on_done) {
  return forward(rq, &engine::broadcast, corrupt_side::destination, {nullptr, 0},
                 std::move(on_done));
}

result<transfer> fault_injecting_engine::all_reduce(const collective_request& rq,
                                                    completion_fn on_done) {
  return forward(rq, &engine::all_reduce, corrupt_side::destination, {nullptr, 0},
                 std::move(on_done));
}

status fault_injecting_engine::cancel(const transfer& t) {
  transfer inner_t;
  std::shared_ptr<transfer_state> outer;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    auto it = impl_->entries.find(t.id());
    if (it == impl_->entries.end()) {
      return make_status(status_code::invalid_argument,
                         "fault: transfer " + std::to_string(t.id()) + " is not in flight");
    }
    inner_t = it->second.inner;
    outer = it->second.outer;
  }
  if (inner_t.valid()) return inner_->cancel(inner_t);
  // Not started yet (delayed or dropped): finish it here; the timer finds it done.
  impl_->finish(outer,
                completion{make_status(status_code::canceled, "fault: canceled by caller"), 0, 0});
  return ok_status();
}

// Decides the fault for one transfer and starts it (now, later, or never).
result<transfer> fault_injecting_engine::impl::inject(launch_plan plan, completion_fn on_done) {
  impl& im = *this;
  fault_kind kind = fault_kind::none;
  bool corrupt = false;
  std::uint32_t delay_ms = 0;
  std::size_t corrupt_at = 0;
  {
    std::lock_guard<std::mutex> lock(im.mutex);
    std::uint64_t index = im.counters.transfers++;
    const fault_policy& p = im.policy;
    // Draw every random number on every call, so one fault's setting does not shift the
    // sequence of another's.
    double drop_draw = im.uniform();
    double corrupt_draw = im.uniform();
    std::uint64_t where = im.rng();
    if (p.fail_after_n >= 0 && index >= static_cast<std::uint64_t>(p.fail_after_n)) {
      kind = fault_kind::fail;
      ++im.counters.failed;
    } else if (drop_draw < p.drop_probability) {
      kind = fault_kind::drop;
      ++im.counters.dropped;
    } else {
      corrupt =
          corrupt_draw < p.corrupt_probability && plan.bytes != nullptr && plan.size_bytes > 0;
      if (corrupt) {
        ++im.counters.corrupted;
        corrupt_at = where % plan.size_bytes;
      }
      delay_ms = p.delay_ms;
      if (delay_ms > 0) ++im.counters.delayed;
    }
  }
  // The deadline counts from this call, like on every engine.
  std::uint32_t timeout_ms = plan.timeout_ms;
  {
    std::lock_guard<std::mutex> lock(im.mutex);
    if (timeout_ms == 0) timeout_ms = im.policy.default_timeout_ms;
  }
  auto outer = make_transfer_state(std::move(on_done));
  const auto start_time = clock::now();

  auto register_entry = [&im, outer] {
    std::lock_guard<std::mutex> lock(im.mutex);
    im.entries[outer->id()] = impl::entry{outer, transfer{}};
  };

  if (kind == fault_kind::fail) {
    register_entry();
    im.add_timer(start_time, [&im, outer] {
      im.finish(outer, completion{make_status(status_code::io_error,
                                              "fault: injected failure (fail_after_n reached)"),
                                  0, 0});
    });
    return transfer(outer);
  }
  if (kind == fault_kind::drop) {
    // The bytes vanish; the only trace is the deadline.
    register_entry();
    std::uint32_t ms = timeout_ms;
    im.add_timer(start_time + std::chrono::milliseconds(ms), [&im, outer, ms] {
      im.finish(outer, completion{make_status(status_code::timeout,
                                              "fault: transfer dropped, deadline of " +
                                                  std::to_string(ms) + " ms expired"),
                                  0, 0});
    });
    return transfer(outer);
  }

  // Started now or after the delay. `start` returns the immediate error, if any.
  auto start = [&im, plan, outer, corrupt, corrupt_at, start_time, timeout_ms]() -> status {
    if (outer->done()) return ok_status();  // canceled while delayed
    auto elapsed_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - start_time).count();
    auto remaining_ms = static_cast<std::uint32_t>(
        std::max<std::int64_t>(1, static_cast<std::int64_t>(timeout_ms) - elapsed_ms));
    std::byte* flip = nullptr;
    if (corrupt && plan.side == corrupt_side::source) {
      flip = plan.bytes + corrupt_at;
      *flip ^= std::byte{0xff};
    }
    auto on_inner = [&im, plan, outer, corrupt, corrupt_at, flip](const completion& c) {
      if (flip != nullptr) *flip ^= std::byte{0xff};  // restore the source
      if (corrupt && plan.side == corrupt_side::destination && c.result.ok() && c.size_bytes > 0) {
        plan.bytes[corrupt_at % std::min(c.size_bytes, plan.size_bytes)] ^= std::byte{0xff};
      }
      im.finish(outer, c);
    };
    auto t = plan.start(on_inner, remaining_ms);
    if (!t.ok()) {
      if (flip != nullptr) *flip ^= std::byte{0xff};
      return t.error();
    }
    std::lock_guard<std::mutex> lock(im.mutex);
    auto it = im.entries.find(outer->id());
    if (it != im.entries.end()) it->second.inner = *t;
    return ok_status();
  };

  register_entry();
  if (delay_ms == 0) {
    status s = start();
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(im.mutex);
      im.entries.erase(outer->id());
      return s;  // immediate error: the callback never runs, as on every engine
    }
    return transfer(outer);
  }
  if (delay_ms >= timeout_ms) {
    im.add_timer(start_time + std::chrono::milliseconds(timeout_ms), [&im, outer, timeout_ms] {
      im.finish(outer, completion{make_status(status_code::timeout,
                                              "fault: injected delay exceeds the " +
                                                  std::to_string(timeout_ms) + " ms deadline"),
                                  0, 0});
    });
    return transfer(outer);
  }
  im.add_timer(start_time + std::chrono::milliseconds(delay_ms), [&im, outer, start] {
    status s = start();
    if (!s.ok()) im.finish(outer, completion{s, 0, 0});
  });
  return transfer(outer);
}

result<std::unique_ptr<fault_injecting_engine>> make_fault_injecting_engine(
    std::unique_ptr<engine> inner, const fault_policy& policy) {
  if (!inner) return make_status(status_code::invalid_argument, "fault: no engine to wrap");
  status s = check_policy(policy);
  if (!s.ok()) return s;
  return std::make_unique<fault_injecting_engine>(std::move(inner), policy);
}

}  // namespace weft::transport
