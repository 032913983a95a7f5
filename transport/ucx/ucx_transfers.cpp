// The UCX engine: transfers, completion, deadlines and the progress thread. See ucx_engine.cpp
// for the concurrency and lifetime rules.

#include <poll.h>

#include <algorithm>

#include <spdlog/spdlog.h>

#include "transport/ucx/internal/ucx_engine_impl.hpp"

namespace weft::transport::ucx::internal {

// -- transfers --------------------------------------------------------------------------------

std::unique_ptr<op> ucx_engine::new_op(op_kind kind, std::uint32_t timeout_ms,
                                       completion_fn on_done) {
  auto o = std::make_unique<op>();
  o->owner = this;
  o->kind = kind;
  o->timeout_ms = timeout_ms != 0 ? timeout_ms : config_.default_timeout_ms;
  o->deadline = clock::now() + std::chrono::milliseconds(o->timeout_ms);
  o->state = make_transfer_state(std::move(on_done));
  return o;
}

ucp_request_param_t ucx_engine::param_for(op* o, ucp_mem_h memh) const {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.user_data = o;
  if (o->kind == op_kind::recv) {
    p.cb.recv = recv_cb;
    // UCX 1.13 does not fill recv_info.tag_info on immediate completion (measured): always take
    // the callback path so the received length and sender tag are known.
    p.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  } else {
    p.cb.send = send_cb;
  }
  if (memh != nullptr) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    p.memh = memh;
  }
  return p;
}

// Records the outcome of a ucp *_nbx call.
void ucx_engine::track(op* o, ucs_status_ptr_t p) {
  if (UCS_PTR_IS_PTR(p) && p == o->early) {
    o->early = nullptr;  // completed (and freed) already
  } else if (UCS_PTR_IS_PTR(p)) {
    o->requests.push_back(p);
    ++o->pending;
  } else if (UCS_PTR_IS_ERR(p) && o->ucs == UCS_OK) {
    o->ucs = UCS_PTR_STATUS(p);
  }
}

void ucx_engine::release_regions(op* o) {
  for (std::uint64_t id : o->regions) {
    auto it = regions_.find(id);
    if (it != regions_.end()) --it->second.busy;
  }
  o->regions.clear();
}

result<transfer> ucx_engine::launch(std::unique_ptr<op> o) {
  transfer t(o->state);
  if (o->pending == 0 && o->ucs != UCS_OK) {
    // Failed before anything was queued: an immediate error, the callback never runs.
    release_regions(o.get());
    return from_ucs(o->ucs, std::string("ucx: ") + name_of(o->kind));
  }
  sweep_needed_ = true;  // completes on the next progress() if it already finished
  ops_.emplace(o->state->id(), std::move(o));
  wake_progress();
  return t;
}

void ucx_engine::wake_progress() {
  if (config_.progress == progress_mode::thread && worker_ != nullptr) ucp_worker_signal(worker_);
}

result<transfer> ucx_engine::start_rma(op_kind kind, peer_handle peer,
                                       std::span<const rma_segment> segments,
                                       const transfer_options& options, completion_fn on_done) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto pit = peers_.find(peer.id);
  if (pit == peers_.end()) {
    return make_status(status_code::invalid_argument,
                       "ucx: unknown peer " + std::to_string(peer.id));
  }
  if (pit->second.failed) {
    return make_status(status_code::peer_unreachable, "ucx: peer failed: " + pit->second.failure);
  }
  if (segments.empty()) {
    return make_status(status_code::invalid_argument, "ucx: empty batch");
  }
  // All-or-nothing: every segment is checked before the first byte moves.
  struct resolved {
    region_entry* local;
    const remote_entry* remote;
  };
  std::vector<resolved> plan;
  plan.reserve(segments.size());
  std::size_t total = 0;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const rma_segment& sg = segments[i];
    auto rit = regions_.find(sg.local.id);
    if (rit == regions_.end()) {
      return make_status(status_code::invalid_argument, "ucx: segment " + std::to_string(i) +
                                                            ": unknown local region " +
                                                            std::to_string(sg.local.id));
    }
    auto mit = remotes_.find(sg.remote.id);
    if (mit == remotes_.end() || mit->second.peer != peer.id) {
      return make_status(status_code::invalid_argument,
                         "ucx: segment " + std::to_string(i) + ": remote region " +
                             std::to_string(sg.remote.id) + " is unknown or of another peer");
    }
    const region_entry& local = rit->second;
    const remote_entry& remote = mit->second;
    if (sg.size_bytes == 0 || sg.local_offset_bytes > local.r.size_bytes ||
        sg.size_bytes > local.r.size_bytes - sg.local_offset_bytes ||
        sg.remote_offset_bytes > remote.size_bytes ||
        sg.size_bytes > remote.size_bytes - sg.remote_offset_bytes) {
      return make_status(
          status_code::invalid_argument,
          std::string("ucx: ") + name_of(kind) + " segment " + std::to_string(i) + " of " +
              std::to_string(sg.size_bytes) + " bytes out of bounds (local " +
              std::to_string(sg.local_offset_bytes) + "/" + std::to_string(local.r.size_bytes) +
              ", remote " + std::to_string(sg.remote_offset_bytes) + "/" +
              std::to_string(remote.size_bytes) + ")");
    }
    plan.push_back({&rit->second, &mit->second});
    total += sg.size_bytes;
  }
  auto o = new_op(kind, options.timeout_ms, std::move(on_done));
  o->peer = peer.id;
  o->size_bytes = total;
  o->requests.reserve(segments.size() + 1);
  for (std::size_t i = 0; i < segments.size() && o->ucs == UCS_OK; ++i) {
    const rma_segment& sg = segments[i];
    ++plan[i].local->busy;
    o->regions.push_back(sg.local.id);
    ucp_request_param_t p = param_for(o.get(), plan[i].local->memh);
    std::byte* buf = plan[i].local->r.data + sg.local_offset_bytes;
    std::uint64_t raddr = plan[i].remote->address + sg.remote_offset_bytes;
    ucp_rkey_h rkey = plan[i].remote->rkey;
    track(o.get(), kind == op_kind::put
                       ? ucp_put_nbx(pit->second.ep, buf, sg.size_bytes, raddr, rkey, &p)
                       : ucp_get_nbx(pit->second.ep, buf, sg.size_bytes, raddr, rkey, &p));
  }
  // A put completes locally once the buffer is reusable; the flush completes once the bytes are
  // at the target, which is what a transfer promises. One flush covers the whole batch.
  if (kind == op_kind::put && o->ucs == UCS_OK) {
    ucp_request_param_t fp = param_for(o.get(), nullptr);
    track(o.get(), ucp_ep_flush_nbx(pit->second.ep, &fp));
  }
  return launch(std::move(o));
}

result<transfer> ucx_engine::put(const rma_request& rq, completion_fn on_done) {
  rma_segment sg{rq.local, rq.local_offset_bytes, rq.remote, rq.remote_offset_bytes, rq.size_bytes};
  return start_rma(op_kind::put, rq.peer, {&sg, 1}, rq.options, std::move(on_done));
}

result<transfer> ucx_engine::get(const rma_request& rq, completion_fn on_done) {
  rma_segment sg{rq.local, rq.local_offset_bytes, rq.remote, rq.remote_offset_bytes, rq.size_bytes};
  return start_rma(op_kind::get, rq.peer, {&sg, 1}, rq.options, std::move(on_done));
}

result<transfer> ucx_engine::put_batch(const rma_batch_request& rq, completion_fn on_done) {
  return start_rma(op_kind::put, rq.peer, rq.segments, rq.options, std::move(on_done));
}

result<transfer> ucx_engine::get_batch(const rma_batch_request& rq, completion_fn on_done) {
  return start_rma(op_kind::get, rq.peer, rq.segments, rq.options, std::move(on_done));
}

result<transfer> ucx_engine::send(const send_request& rq, completion_fn on_done) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto pit = peers_.find(rq.peer.id);
  if (pit == peers_.end()) {
    return make_status(status_code::invalid_argument,
                       "ucx: unknown peer " + std::to_string(rq.peer.id));
  }
  if (pit->second.failed) {
    return make_status(status_code::peer_unreachable, "ucx: peer failed: " + pit->second.failure);
  }
  auto rit = regions_.find(rq.local.id);
  if (rit == regions_.end() || rq.offset_bytes > rit->second.r.size_bytes ||
      rq.size_bytes > rit->second.r.size_bytes - rq.offset_bytes) {
    return make_status(status_code::invalid_argument, "ucx: send outside a known local region");
  }
  auto o = new_op(op_kind::send, rq.options.timeout_ms, std::move(on_done));
  o->peer = rq.peer.id;
  o->regions.push_back(rq.local.id);
  o->size_bytes = rq.size_bytes;
  ++rit->second.busy;
  ucp_request_param_t p = param_for(o.get(), rit->second.memh);
  track(o.get(), ucp_tag_send_nbx(pit->second.ep, rit->second.r.data + rq.offset_bytes,
                                  rq.size_bytes, rq.tag, &p));
  return launch(std::move(o));
}

result<transfer> ucx_engine::recv(const recv_request& rq, completion_fn on_done) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto rit = regions_.find(rq.local.id);
  if (rit == regions_.end() || rq.offset_bytes > rit->second.r.size_bytes ||
      rq.size_bytes > rit->second.r.size_bytes - rq.offset_bytes) {
    return make_status(status_code::invalid_argument, "ucx: recv outside a known local region");
  }
  auto o = new_op(op_kind::recv, rq.options.timeout_ms, std::move(on_done));
  o->regions.push_back(rq.local.id);
  o->size_bytes = rq.size_bytes;
  ++rit->second.busy;
  ucp_request_param_t p = param_for(o.get(), rit->second.memh);
  ucs_status_ptr_t r = ucp_tag_recv_nbx(worker_, rit->second.r.data + rq.offset_bytes,
                                        rq.size_bytes, rq.tag, rq.tag_mask, &p);
  track(o.get(), r);
  return launch(std::move(o));
}

// -- completion -------------------------------------------------------------------------------

void ucx_engine::on_request_done(op* o, void* request, ucs_status_t s) {
  bool known = false;
  for (void*& slot : o->requests) {
    if (slot == request) {
      slot = nullptr;
      --o->pending;
      known = true;
    }
  }
  // With NO_IMM_CMPL, UCX 1.13 runs the callback of a receive that matches an unexpected message
  // inside ucp_tag_recv_nbx, before the request is returned: track() must not count it.
  if (!known) o->early = request;
  if (s != UCS_OK && o->ucs == UCS_OK) o->ucs = s;
  ucp_request_free(request);
  sweep_needed_ = true;
}

void ucx_engine::on_peer_error(ucp_ep_h ep, ucs_status_t s) {
  for (auto& [id, p] : peers_) {
    if (p.ep == ep) {
      p.failed = true;
      p.failure = ucs_status_string(s);
      spdlog::warn("ucx engine: peer {} failed: {}", id, p.failure);
    }
  }
}

void ucx_engine::abort_op(op* o, status why) {
  if (!o->notified) {
    o->notified = true;
    ready_.emplace_back(o->state, completion{std::move(why), 0, 0});
  }
  // Cancel what UCX can cancel (tag receives, pending sends). Puts and gets may not be
  // cancelable: the op stays until UCX returns their requests, keeping the region busy.
  for (void* r : o->requests) {
    if (r != nullptr) ucp_request_cancel(worker_, r);
  }
  sweep_needed_ = true;
}

void ucx_engine::expire_deadlines() {
  auto now = clock::now();
  std::vector<op*> expired;
  for (auto& [id, o] : ops_) {
    if (!o->notified && o->pending > 0 && now >= o->deadline) expired.push_back(o.get());
  }
  for (op* o : expired) {
    abort_op(o, make_status(status_code::timeout,
                            std::string("ucx: ") + name_of(o->kind) + " of " +
                                std::to_string(o->size_bytes) + " bytes missed its " +
                                std::to_string(o->timeout_ms) + " ms deadline"));
  }
}

void ucx_engine::sweep() {
  if (!sweep_needed_) return;
  sweep_needed_ = false;
  for (auto it = ops_.begin(); it != ops_.end();) {
    op* o = it->second.get();
    if (o->pending > 0) {
      ++it;
      continue;
    }
    if (!o->notified) {
      o->notified = true;
      completion c;
      c.size_bytes = o->size_bytes;
      if (o->ucs != UCS_OK) {
        c.result = from_ucs(o->ucs, std::string("ucx: ") + name_of(o->kind));
        if (o->ucs == UCS_ERR_MESSAGE_TRUNCATED) {
          c.result = make_status(status_code::io_error, "ucx: recv: message larger than the " +
                                                            std::to_string(o->size_bytes) +
                                                            "-byte receive buffer");
        }
        c.size_bytes = 0;
      } else if (o->kind == op_kind::recv) {
        c.size_bytes = o->recv_info.length;
        c.tag = o->recv_info.sender_tag;
      }
      ready_.emplace_back(o->state, std::move(c));
    }
    release_regions(o);
    it = ops_.erase(it);
  }
}

std::vector<std::pair<std::shared_ptr<transfer_state>, completion>> ucx_engine::take_ready() {
  std::vector<std::pair<std::shared_ptr<transfer_state>, completion>> out;
  out.swap(ready_);
  return out;
}

void ucx_engine::fire(std::vector<std::pair<std::shared_ptr<transfer_state>, completion>> ready) {
  for (auto& [state, c] : ready) state->finish(std::move(c));
}

std::size_t ucx_engine::progress() {
  std::size_t n = 0;
  std::vector<std::pair<std::shared_ptr<transfer_state>, completion>> ready;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int i = 0; i < 64; ++i) {
      unsigned k = ucp_worker_progress(worker_);
      if (k == 0) break;
      n += k;
    }
    if (!ops_.empty()) expire_deadlines();
    sweep();
    ready = take_ready();
    timed_work_.store(!ops_.empty() || !closing_.empty(), std::memory_order_relaxed);
  }
  n += ready.size();
  fire(std::move(ready));
  return n;
}

status ucx_engine::cancel(const transfer& t) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = ops_.find(t.id());
  if (it == ops_.end() || it->second->notified) {
    return make_status(status_code::invalid_argument,
                       "ucx: transfer " + std::to_string(t.id()) + " is not in flight");
  }
  abort_op(it->second.get(), make_status(status_code::canceled, "ucx: canceled by caller"));
  wake_progress();
  return ok_status();
}

// -- progress thread --------------------------------------------------------------------------

// Sleeps until the worker has events or `max_wait` passed. Returns false if it did not sleep
// because events are already pending.
bool ucx_engine::worker_idle_wait(std::chrono::microseconds max_wait) {
  if (efd_ < 0) {
    std::this_thread::sleep_for(std::min(max_wait, std::chrono::microseconds(200)));
    return true;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) return false;
  }
  pollfd pfd{efd_, POLLIN, 0};
  int ms = static_cast<int>(std::max<long>(1, max_wait.count() / 1000));
  ::poll(&pfd, 1, ms);
  return true;
}

void ucx_engine::progress_loop() {
  // Spin while events flow (a wake-up across vCPUs costs ~100 us here), then block on the
  // worker's event fd. Only progress earns a new spell of spinning: a wait that ends with nothing
  // to do goes straight back to waiting. (Spinning again after every quiet wait, with a
  // sched_yield every 64 polls, kept an idle engine at ~2.3 % of a core and ~6,000 sched_yield
  // calls a second; session 56.) The wait is capped at 5 ms while transfers are in flight, so
  // their deadlines are checked; with nothing in flight it lasts up to a second: work posted from
  // other threads ends it (wake_progress), and the 5 ms wake-ups of an idle engine, ~200 a
  // second, each preempted a compute thread of a serving worker (session 57).
  constexpr unsigned spin_budget = 2000;
  unsigned idle_spins = spin_budget;
  while (!stop_.load(std::memory_order_relaxed)) {
    if (progress() > 0) {
      idle_spins = 0;
      continue;
    }
    if (idle_spins < spin_budget) {
      if (++idle_spins % 64 == 0) std::this_thread::yield();
      continue;
    }
    worker_idle_wait(timed_work_.load(std::memory_order_relaxed) ? std::chrono::milliseconds(5)
                                                                 : std::chrono::milliseconds(1000));
  }
}

}  // namespace weft::transport::ucx::internal
