#include "transport/engine.hpp"

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

}  // namespace weft::transport
