// The in-process engine.
//
// Engines find each other through a process-wide directory keyed by a unique engine id; the
// directory lock is held across a copy into another engine's region, so neither engine can
// release that region (or be destroyed) mid-copy. Lock order: directory -> target engine.
// Copies run on the initiating thread; completions are queued and fired from progress(), like
// every other engine.

#include "transport/inproc/inproc_engine.hpp"

#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <new>
#include <thread>
#include <unordered_map>

#include "transport/internal/envelope.hpp"

namespace weft::transport::inproc {

namespace {

using internal::byte_reader;
using internal::byte_writer;
using internal::envelope_kind;

class inproc_engine;

struct directory {
  std::mutex mutex;
  std::unordered_map<std::uint64_t, inproc_engine*> engines;
  std::uint64_t next_uid = 1;
};

directory& dir() {
  static auto* d = new directory;  // never destroyed: engines may outlive static teardown order
  return *d;
}

struct region_entry {
  region r;
  bool allocated = false;
};

struct remote_entry {
  std::uint64_t peer = 0;
  std::uint64_t owner_uid = 0;
  std::uint64_t region_id = 0;
  std::size_t size_bytes = 0;
};

struct posted_recv {
  std::shared_ptr<transfer_state> state;
  recv_request request;
  std::byte* dest = nullptr;
  clock::time_point deadline;
  std::uint32_t timeout_ms = 0;
};

struct unexpected_msg {
  tag_t tag = 0;
  bytes data;
};

using ready_list = std::vector<std::pair<std::shared_ptr<transfer_state>, completion>>;

class inproc_engine final : public engine {
 public:
  explicit inproc_engine(const engine_config& config) : config_(config) {
    std::lock_guard<std::mutex> lock(dir().mutex);
    uid_ = dir().next_uid++;
    dir().engines[uid_] = this;
  }

  ~inproc_engine() override {
    {
      std::lock_guard<std::mutex> lock(dir().mutex);
      dir().engines.erase(uid_);
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
      for (auto& p : posted_) {
        ready_.emplace_back(
            p.state, completion{make_status(status_code::canceled, "engine shut down"), 0, 0});
      }
      posted_.clear();
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    fire(take_ready());
    for (auto& [id, e] : regions_) {
      if (e.allocated) ::operator delete (e.r.data, std::align_val_t{64});
    }
  }

  void start() {
    if (config_.progress == progress_mode::thread) thread_ = std::thread([this] { loop(); });
  }

  capabilities caps() const override {
    capabilities c;
    c.name = "inproc";
    c.one_sided = true;
    c.tagged = true;
    return c;
  }

  // -- memory ---------------------------------------------------------------------------------

  result<region> register_memory(void* data, std::size_t size_bytes, memory_kind kind) override {
    if (kind != memory_kind::host) {
      return make_status(status_code::unsupported, "inproc: host memory only");
    }
    if (data == nullptr || size_bytes == 0) {
      return make_status(status_code::invalid_argument, "inproc: empty region");
    }
    return add_region(static_cast<std::byte*>(data), size_bytes, false);
  }

  result<region> allocate_memory(std::size_t size_bytes, memory_kind kind) override {
    if (kind != memory_kind::host) {
      return make_status(status_code::unsupported, "inproc: host memory only");
    }
    if (size_bytes == 0) return make_status(status_code::invalid_argument, "inproc: empty region");
    auto* p =
        static_cast<std::byte*>(::operator new (size_bytes, std::align_val_t{64}, std::nothrow));
    if (p == nullptr) return make_status(status_code::no_memory, "inproc: allocation failed");
    return add_region(p, size_bytes, true);
  }

  status release_memory(const region& r) override {
    // The directory lock excludes copies into this engine's regions by other engines.
    std::lock_guard<std::mutex> dlock(dir().mutex);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = regions_.find(r.id);
    if (it == regions_.end()) return unknown("region", r.id);
    for (const auto& p : posted_) {
      if (p.request.local.id == r.id) {
        return make_status(status_code::busy, "inproc: region has a posted receive");
      }
    }
    if (it->second.allocated) ::operator delete (it->second.r.data, std::align_val_t{64});
    regions_.erase(it);
    return ok_status();
  }

  result<bytes> describe(const region& r) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = regions_.find(r.id);
    if (it == regions_.end()) return unknown("region", r.id);
    byte_writer w;
    w.u64(static_cast<std::uint64_t>(::getpid()));
    w.u64(uid_);
    w.u64(r.id);
    w.u64(it->second.r.size_bytes);
    return internal::seal(envelope_kind::inproc_region, w.out());
  }

  // -- peers ----------------------------------------------------------------------------------

  result<bytes> local_address() override {
    byte_writer w;
    w.u64(static_cast<std::uint64_t>(::getpid()));
    w.u64(uid_);
    return internal::seal(envelope_kind::inproc_address, w.out());
  }

  result<peer_handle> connect(std::span<const std::byte> address) override {
    auto payload = internal::open(envelope_kind::inproc_address, address);
    if (!payload) return payload.error();
    byte_reader rd(*payload);
    std::uint64_t pid = 0, uid = 0;
    if (!rd.u64(pid) || !rd.u64(uid) || !rd.at_end()) {
      return make_status(status_code::invalid_argument, "inproc: malformed address");
    }
    if (pid != static_cast<std::uint64_t>(::getpid())) {
      return make_status(status_code::peer_unreachable,
                         "inproc: address of another process (pid " + std::to_string(pid) + ")");
    }
    {
      std::lock_guard<std::mutex> lock(dir().mutex);
      if (dir().engines.count(uid) == 0) {
        return make_status(status_code::peer_unreachable, "inproc: engine no longer exists");
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    std::uint64_t id = next_id_++;
    peers_[id] = uid;
    return peer_handle{id};
  }

  status disconnect(peer_handle peer) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (peers_.erase(peer.id) == 0) return unknown("peer", peer.id);
    std::erase_if(remotes_, [&](const auto& kv) { return kv.second.peer == peer.id; });
    return ok_status();
  }

  result<remote_region> import_remote(peer_handle peer,
                                      std::span<const std::byte> descriptor) override {
    auto payload = internal::open(envelope_kind::inproc_region, descriptor);
    if (!payload) return payload.error();
    byte_reader rd(*payload);
    std::uint64_t pid = 0, uid = 0, rid = 0, size = 0;
    if (!rd.u64(pid) || !rd.u64(uid) || !rd.u64(rid) || !rd.u64(size) || !rd.at_end()) {
      return make_status(status_code::invalid_argument, "inproc: malformed region descriptor");
    }
    std::lock_guard<std::mutex> lock(mutex_);
    auto pit = peers_.find(peer.id);
    if (pit == peers_.end()) return unknown("peer", peer.id);
    if (pid != static_cast<std::uint64_t>(::getpid()) || uid != pit->second) {
      return make_status(status_code::invalid_argument,
                         "inproc: descriptor does not belong to this peer");
    }
    std::uint64_t id = next_id_++;
    remotes_[id] = remote_entry{peer.id, uid, rid, size};
    return remote_region{id, size};
  }

  status release_remote(remote_region remote) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (remotes_.erase(remote.id) == 0) return unknown("remote region", remote.id);
    return ok_status();
  }

  // -- transfers ------------------------------------------------------------------------------

  result<transfer> put(const rma_request& rq, completion_fn on_done) override {
    rma_segment sg{rq.local, rq.local_offset_bytes, rq.remote, rq.remote_offset_bytes,
                   rq.size_bytes};
    return rma(rq.peer, {&sg, 1}, std::move(on_done), /*is_put=*/true);
  }
  result<transfer> get(const rma_request& rq, completion_fn on_done) override {
    rma_segment sg{rq.local, rq.local_offset_bytes, rq.remote, rq.remote_offset_bytes,
                   rq.size_bytes};
    return rma(rq.peer, {&sg, 1}, std::move(on_done), /*is_put=*/false);
  }
  result<transfer> put_batch(const rma_batch_request& rq, completion_fn on_done) override {
    return rma(rq.peer, rq.segments, std::move(on_done), /*is_put=*/true);
  }
  result<transfer> get_batch(const rma_batch_request& rq, completion_fn on_done) override {
    return rma(rq.peer, rq.segments, std::move(on_done), /*is_put=*/false);
  }

  result<transfer> send(const send_request& rq, completion_fn on_done) override {
    std::uint64_t target_uid = 0;
    const std::byte* src = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto pit = peers_.find(rq.peer.id);
      if (pit == peers_.end()) return unknown("peer", rq.peer.id);
      target_uid = pit->second;
      auto r = local_span(rq.local, rq.offset_bytes, rq.size_bytes);
      if (!r) return r.error();
      src = *r;
    }
    auto state = make_transfer_state(std::move(on_done));
    status delivered;
    {
      std::lock_guard<std::mutex> dlock(dir().mutex);
      auto it = dir().engines.find(target_uid);
      if (it == dir().engines.end()) {
        delivered = make_status(status_code::peer_unreachable, "inproc: peer engine is gone");
      } else {
        it->second->deliver(rq.tag, {src, rq.size_bytes});
      }
    }
    complete(state, completion{delivered, delivered.ok() ? rq.size_bytes : 0, rq.tag});
    return transfer(state);
  }

  result<transfer> recv(const recv_request& rq, completion_fn on_done) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto r = local_span(rq.local, rq.offset_bytes, rq.size_bytes);
    if (!r) return r.error();
    auto state = make_transfer_state(std::move(on_done));
    for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
      if ((it->tag & rq.tag_mask) == (rq.tag & rq.tag_mask)) {
        ready_.emplace_back(state, copy_out(*it, *r, rq.size_bytes));
        unexpected_.erase(it);
        cv_.notify_all();
        return transfer(state);
      }
    }
    std::uint32_t timeout_ms =
        rq.options.timeout_ms ? rq.options.timeout_ms : config_.default_timeout_ms;
    posted_.push_back(posted_recv{
        state, rq, *r, clock::now() + std::chrono::milliseconds(timeout_ms), timeout_ms});
    cv_.notify_all();
    return transfer(state);
  }

  status cancel(const transfer& t) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = posted_.begin(); it != posted_.end(); ++it) {
      if (it->state->id() == t.id()) {
        ready_.emplace_back(
            it->state,
            completion{make_status(status_code::canceled, "inproc: canceled by caller"), 0, 0});
        posted_.erase(it);
        cv_.notify_all();
        return ok_status();
      }
    }
    return make_status(status_code::invalid_argument,
                       "inproc: transfer " + std::to_string(t.id()) + " is not in flight");
  }

  std::size_t progress() override {
    ready_list ready;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      expire();
      ready.swap(ready_);
    }
    std::size_t n = ready.size();
    fire(std::move(ready));
    return n;
  }

  progress_mode mode() const override { return config_.progress; }

 private:
  status unknown(const char* what, std::uint64_t id) const {
    return make_status(status_code::invalid_argument,
                       std::string("inproc: unknown ") + what + " " + std::to_string(id));
  }

  region add_region(std::byte* data, std::size_t size_bytes, bool allocated) {
    std::lock_guard<std::mutex> lock(mutex_);
    region r{next_id_++, data, size_bytes, memory_kind::host};
    regions_[r.id] = region_entry{r, allocated};
    return r;
  }

  // mutex_ held.
  result<std::byte*> local_span(const region& r, std::size_t offset, std::size_t size) const {
    auto it = regions_.find(r.id);
    if (it == regions_.end()) return unknown("region", r.id);
    if (offset > it->second.r.size_bytes || size > it->second.r.size_bytes - offset) {
      return make_status(status_code::invalid_argument, "inproc: span outside the local region");
    }
    return it->second.r.data + offset;
  }

  completion copy_out(const unexpected_msg& m, std::byte* dest, std::size_t capacity) {
    if (m.data.size() > capacity) {
      return completion{make_status(status_code::io_error,
                                    "inproc: recv: message of " + std::to_string(m.data.size()) +
                                        " bytes larger than the " + std::to_string(capacity) +
                                        "-byte receive buffer"),
                        0, m.tag};
    }
    if (!m.data.empty()) std::memcpy(dest, m.data.data(), m.data.size());
    return completion{ok_status(), m.data.size(), m.tag};
  }

  // Called by a sender with the directory lock held.
  void deliver(tag_t tag, std::span<const std::byte> data) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = posted_.begin(); it != posted_.end(); ++it) {
      if ((tag & it->request.tag_mask) == (it->request.tag & it->request.tag_mask)) {
        unexpected_msg m{tag, {}};
        if (data.size() <= it->request.size_bytes) {
          if (!data.empty()) std::memcpy(it->dest, data.data(), data.size());
          ready_.emplace_back(it->state, completion{ok_status(), data.size(), tag});
        } else {
          m.data.resize(data.size());
          ready_.emplace_back(it->state, copy_out(m, it->dest, it->request.size_bytes));
        }
        posted_.erase(it);
        cv_.notify_all();
        return;
      }
    }
    unexpected_.push_back(unexpected_msg{tag, bytes(data.begin(), data.end())});
  }

  // Copies between a local region and the remote region of another engine, synchronously.
  result<transfer> rma(peer_handle peer, std::span<const rma_segment> segments,
                       completion_fn on_done, bool is_put) {
    struct resolved {
      remote_entry remote;
      std::byte* local;
    };
    std::vector<resolved> plan;
    std::size_t total = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (segments.empty())
        return make_status(status_code::invalid_argument, "inproc: empty batch");
      for (const rma_segment& sg : segments) {
        auto mit = remotes_.find(sg.remote.id);
        if (mit == remotes_.end() || mit->second.peer != peer.id) {
          return make_status(status_code::invalid_argument,
                             "inproc: remote region unknown or of another peer");
        }
        const remote_entry& remote = mit->second;
        auto r = local_span(sg.local, sg.local_offset_bytes, sg.size_bytes);
        if (!r) return r.error();
        if (sg.size_bytes == 0 || sg.remote_offset_bytes > remote.size_bytes ||
            sg.size_bytes > remote.size_bytes - sg.remote_offset_bytes) {
          return make_status(status_code::invalid_argument,
                             "inproc: span outside the remote region");
        }
        plan.push_back({remote, *r});
        total += sg.size_bytes;
      }
    }
    auto state = make_transfer_state(std::move(on_done));
    status s;
    {
      std::lock_guard<std::mutex> dlock(dir().mutex);
      for (std::size_t i = 0; i < plan.size() && s.ok(); ++i) {
        auto it = dir().engines.find(plan[i].remote.owner_uid);
        if (it == dir().engines.end()) {
          s = make_status(status_code::peer_unreachable, "inproc: peer engine is gone");
        } else {
          s = it->second->copy_region(plan[i].remote.region_id, segments[i].remote_offset_bytes,
                                      plan[i].local, segments[i].size_bytes, is_put);
        }
      }
    }
    complete(state, completion{s, s.ok() ? total : 0, 0});
    return transfer(state);
  }

  // Called by another engine with the directory lock held.
  status copy_region(std::uint64_t region_id, std::size_t offset, std::byte* other,
                     std::size_t size, bool into_this) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = regions_.find(region_id);
    if (it == regions_.end()) {
      return make_status(status_code::io_error, "inproc: remote region was released");
    }
    std::byte* mine = it->second.r.data + offset;
    if (into_this) {
      std::memmove(mine, other, size);
    } else {
      std::memmove(other, mine, size);
    }
    return ok_status();
  }

  void complete(const std::shared_ptr<transfer_state>& state, completion c) {
    std::lock_guard<std::mutex> lock(mutex_);
    ready_.emplace_back(state, std::move(c));
    cv_.notify_all();
  }

  // mutex_ held.
  void expire() {
    auto now = clock::now();
    for (auto it = posted_.begin(); it != posted_.end();) {
      if (now >= it->deadline) {
        ready_.emplace_back(
            it->state, completion{make_status(status_code::timeout,
                                              "inproc: recv missed its " +
                                                  std::to_string(it->timeout_ms) + " ms deadline"),
                                  0, 0});
        it = posted_.erase(it);
      } else {
        ++it;
      }
    }
  }

  ready_list take_ready() {
    std::lock_guard<std::mutex> lock(mutex_);
    ready_list out;
    out.swap(ready_);
    return out;
  }

  static void fire(ready_list ready) {
    for (auto& [state, c] : ready) state->finish(std::move(c));
  }

  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      expire();
      if (!ready_.empty()) {
        ready_list ready;
        ready.swap(ready_);
        lock.unlock();
        fire(std::move(ready));
        lock.lock();
        continue;
      }
      auto until = clock::now() + std::chrono::milliseconds(100);
      for (const auto& p : posted_) until = std::min(until, p.deadline);
      cv_.wait_until(lock, until);
    }
  }

  engine_config config_;
  std::uint64_t uid_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::uint64_t next_id_ = 1;
  std::unordered_map<std::uint64_t, region_entry> regions_;
  std::unordered_map<std::uint64_t, std::uint64_t> peers_;  // peer id -> engine uid
  std::unordered_map<std::uint64_t, remote_entry> remotes_;
  std::deque<posted_recv> posted_;
  std::deque<unexpected_msg> unexpected_;
  ready_list ready_;
  std::thread thread_;
};

}  // namespace

result<std::unique_ptr<engine>> make_engine(const engine_config& config) {
  if (!config.params.empty()) {
    return make_status(status_code::invalid_argument, "inproc engine takes no params (got '" +
                                                          config.params.begin()->first + "')");
  }
  auto e = std::make_unique<inproc_engine>(config);
  e->start();
  return std::unique_ptr<engine>(std::move(e));
}

}  // namespace weft::transport::inproc
