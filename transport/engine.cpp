#include "transport/engine.hpp"

#include <memory>
#include <mutex>
#include <thread>

namespace weft::transport {

namespace {

result<transfer> unsupported(const engine& e, const char* what) {
  return make_status(status_code::unsupported,
                     std::string(what) + " is not supported by engine '" + e.caps().name + "'");
}

}  // namespace

std::size_t size_of(data_type t) {
  switch (t) {
    case data_type::f32:
      return 4;
    case data_type::f16:
      return 2;
    case data_type::bf16:
      return 2;
    case data_type::f64:
      return 8;
    case data_type::i32:
      return 4;
    case data_type::i64:
      return 8;
    case data_type::u8:
      return 1;
  }
  return 0;
}

result<transfer> engine::put(const rma_request&, completion_fn) {
  return unsupported(*this, "put");
}
result<transfer> engine::get(const rma_request&, completion_fn) {
  return unsupported(*this, "get");
}
result<transfer> engine::put_batch(const rma_batch_request&, completion_fn) {
  return unsupported(*this, "put_batch");
}
result<transfer> engine::get_batch(const rma_batch_request&, completion_fn) {
  return unsupported(*this, "get_batch");
}
result<transfer> engine::send(const send_request&, completion_fn) {
  return unsupported(*this, "send");
}
result<transfer> engine::recv(const recv_request&, completion_fn) {
  return unsupported(*this, "recv");
}
result<transfer> engine::broadcast(const collective_request&, completion_fn) {
  return unsupported(*this, "broadcast");
}
result<transfer> engine::all_reduce(const collective_request&, completion_fn) {
  return unsupported(*this, "all_reduce");
}

completion engine::wait(const transfer& t) {
  if (!t.valid()) {
    return completion{make_status(status_code::invalid_argument, "wait on an empty transfer"), 0,
                      0};
  }
  if (mode() == progress_mode::manual) {
    unsigned idle = 0;
    while (!t.done()) {
      if (progress() == 0 && ++idle % 64 == 0) std::this_thread::yield();
    }
  } else {
    while (!t.state()->wait_until(clock::now() + std::chrono::milliseconds(100))) {
    }
  }
  return t.result();
}

namespace {

/// The joint completion of several single gets (+1 guard while they are being started).
struct joint_completion {
  std::mutex mu;
  int64_t remaining = 1;
  status first_error;
  std::size_t bytes = 0;
  completion_fn on_done;

  void part(const completion& c) {
    completion total;
    {
      std::lock_guard lock(mu);
      if (!c.result.ok() && first_error.ok()) first_error = c.result;
      if (c.result.ok()) bytes += c.size_bytes;
      if (--remaining != 0) return;
      total.result = first_error;
      total.size_bytes = bytes;
    }
    if (on_done) on_done(total);
  }
};

}  // namespace

result<std::vector<transfer>> get_all(engine& e, const rma_batch_request& request,
                                      completion_fn on_done) {
  std::vector<transfer> started;
  auto batch = e.get_batch(request, on_done);
  if (batch) {
    started.push_back(*batch);
    return started;
  }
  if (batch.error().code != status_code::unsupported) return batch.error();
  auto joint = std::make_shared<joint_completion>();
  joint->on_done = std::move(on_done);
  joint->remaining = static_cast<int64_t>(request.segments.size()) + 1;
  for (size_t i = 0; i < request.segments.size(); ++i) {
    const auto& s = request.segments[i];
    rma_request rq{request.peer,          s.local,      s.local_offset_bytes, s.remote,
                   s.remote_offset_bytes, s.size_bytes, request.options};
    auto one = e.get(rq, [joint](const completion& c) { joint->part(c); });
    if (!one) {
      if (i == 0) return one.error();
      {
        std::lock_guard lock(joint->mu);
        if (joint->first_error.ok()) joint->first_error = one.error();
        joint->remaining -= static_cast<int64_t>(request.segments.size() - i);
      }
      for (const auto& t : started) (void)e.cancel(t);
      break;
    }
    started.push_back(*one);
  }
  joint->part(completion{});  // the guard
  return started;
}

}  // namespace weft::transport
