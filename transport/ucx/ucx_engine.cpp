// The UCX engine. Only transport/ucx/ includes ucp headers.
//
// Concurrency: one mutex guards the ucp worker and every table. UCX callbacks run inside
// ucp_worker_progress() (under the mutex) and only record results; user callbacks are fired after
// the mutex is released, so they may start new transfers.
// Lifetime of a UCX operation: an `op` owns its ucp requests (puts + one flush). It is finished
// towards the user once (ok, error, timeout or canceled) but stays in ops_ until UCX released all
// its requests, because UCX may still touch the buffers; regions it uses stay busy until then.

// This file: setup and teardown, memory, peers. Transfers and progress: ucx_transfers.cpp.

#include "transport/ucx/ucx_engine.hpp"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>

#include <spdlog/spdlog.h>

#include "transport/ucx/internal/ucx_engine_impl.hpp"

namespace weft::transport::ucx {

namespace internal {

// -- UCX callbacks ----------------------------------------------------------------------------

void send_cb(void* request, ucs_status_t s, void* user_data) {
  auto* o = static_cast<op*>(user_data);
  o->owner->on_request_done(o, request, s);
}

void recv_cb(void* request, ucs_status_t s, const ucp_tag_recv_info_t* info, void* user_data) {
  auto* o = static_cast<op*>(user_data);
  if (s == UCS_OK && info != nullptr) o->recv_info = *info;
  o->owner->on_request_done(o, request, s);
}

void ep_error_cb(void* arg, ucp_ep_h ep, ucs_status_t s) {
  static_cast<ucx_engine*>(arg)->on_peer_error(ep, s);
}

void close_cb(void* request, ucs_status_t, void* user_data) {
  auto* closing = static_cast<std::vector<void*>*>(user_data);
  closing->erase(std::remove(closing->begin(), closing->end(), request), closing->end());
  ucp_request_free(request);
}

// -- setup / teardown -------------------------------------------------------------------------

// UCX 1.13's tcp transport writes to sockets without MSG_NOSIGNAL on some paths: when a peer
// process dies, the next write raises SIGPIPE, whose default action kills this process (measured
// in tests/integration/transport). A data plane must survive dead peers, so the default action is
// replaced by "ignore" (a handler the application installed is left alone).
static void ignore_sigpipe_once() {
  static const bool done = [] {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      ::signal(SIGPIPE, SIG_IGN);
      spdlog::info("ucx engine: SIGPIPE set to ignore (a dead tcp peer would otherwise kill us)");
    }
    return true;
  }();
  (void)done;
}

status ucx_engine::init() {
  ignore_sigpipe_once();
  ucp_config_t* cfg = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &cfg);
  if (s != UCS_OK) return from_ucs(s, "ucp_config_read");
  std::string tls = std::getenv("UCX_TLS") != nullptr ? std::getenv("UCX_TLS") : "";
  std::string error_handling = "auto";
  for (const auto& [key, value] : config_.params) {
    if (key == "weft.error_handling") {
      if (value != "auto" && value != "peer" && value != "none") {
        ucp_config_release(cfg);
        return make_status(status_code::invalid_argument,
                           "weft.error_handling must be auto, peer or none, not '" + value + "'");
      }
      error_handling = value;
      continue;
    }
    if (key == "ucx.tls") tls = value;
    if (key.rfind("ucx.", 0) != 0) {
      ucp_config_release(cfg);
      return make_status(status_code::invalid_argument,
                         "unknown ucx engine param '" + key +
                             "' (expected ucx.<UCX variable> or weft.error_handling)");
    }
    std::string name = key.substr(4);
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
    s = ucp_config_modify(cfg, name.c_str(), value.c_str());
    if (s != UCS_OK) {
      ucp_config_release(cfg);
      return make_status(status_code::invalid_argument,
                         "ucx config " + name + "=" + value + ": " + ucs_status_string(s));
    }
  }
  // UCX 1.13 shm transports cannot detect peer failure, so UCP_ERR_HANDLING_MODE_PEER makes them
  // unusable. auto: peer mode only when tcp is the only transport configured; otherwise none, and a
  // dead peer surfaces as a timeout at the transfer's deadline.
  if (error_handling == "auto") error_handling = (tls == "tcp") ? "peer" : "none";
  peer_error_mode_ = error_handling == "peer";
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  s = ucp_init(&params, cfg, &context_);
  ucp_config_release(cfg);
  if (s != UCS_OK) return from_ucs(s, "ucp_init");

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // every worker call holds mutex_
  s = ucp_worker_create(context_, &wp, &worker_);
  if (s != UCS_OK) return from_ucs(s, "ucp_worker_create");
  if (ucp_worker_get_efd(worker_, &efd_) != UCS_OK) efd_ = -1;  // fall back to timed polling

  if (config_.progress == progress_mode::thread) {
    progress_thread_ = std::thread([this] { progress_loop(); });
  }
  return ok_status();
}

// A healthy peer's endpoint is closed gracefully (flush, then close): UCX 1.13 asserts and aborts
// the process when a forced close over tcp purges a wireup reply that is still pending, which
// happens when an engine is destroyed right after connect() (reproduced under ASan timing). An
// endpoint whose peer failed, or that still carries operations (stuck: a flush would wait for
// them forever), is force-closed.
void ucx_engine::close_endpoint(std::uint64_t peer_id, const peer_entry& peer) {
  bool stuck = false;
  for (const auto& [id, o] : ops_) stuck = stuck || (o->peer == peer_id && o->pending > 0);
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.flags = (peer.failed || stuck) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  p.cb.send = close_cb;
  p.user_data = &closing_;
  ucs_status_ptr_t r = ucp_ep_close_nbx(peer.ep, &p);
  if (UCS_PTR_IS_PTR(r)) closing_.push_back(r);
}

void ucx_engine::shutdown() {
  stop_.store(true);
  wake_progress();  // the progress thread may be in a long idle wait
  if (progress_thread_.joinable()) progress_thread_.join();
  if (worker_ == nullptr) {
    if (context_ != nullptr) ucp_cleanup(context_);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<op*> live;
    for (auto& [id, o] : ops_) live.push_back(o.get());
    for (op* o : live) abort_op(o, make_status(status_code::canceled, "engine shut down"));
    for (auto& [id, p] : peers_) close_endpoint(id, p);
    peers_.clear();
    auto until = clock::now() + std::chrono::seconds(2);
    while ((!closing_.empty() || !ops_.empty()) && clock::now() < until) {
      ucp_worker_progress(worker_);
      sweep();
    }
    if (!ops_.empty() || !closing_.empty()) {
      spdlog::warn("ucx engine: {} transfers / {} endpoints still busy at shutdown", ops_.size(),
                   closing_.size());
    }
  }
  fire(take_ready());
  for (auto& [id, rr] : remotes_) ucp_rkey_destroy(rr.rkey);
  remotes_.clear();
  for (auto& [id, re] : regions_) ucp_mem_unmap(context_, re.memh);
  regions_.clear();
  ucp_worker_destroy(worker_);
  worker_ = nullptr;
  ucp_cleanup(context_);
  context_ = nullptr;
}

// -- memory -----------------------------------------------------------------------------------

result<region> ucx_engine::map_memory(void* data, std::size_t size_bytes, memory_kind kind,
                                      bool allocate) {
  if (kind != memory_kind::host) {
    return make_status(status_code::unsupported,
                       "ucx: this UCX build has no CUDA transports; GPU memory is unsupported");
  }
  if (size_bytes == 0) return make_status(status_code::invalid_argument, "ucx: region of 0 bytes");
  if (!allocate && data == nullptr) {
    return make_status(status_code::invalid_argument, "ucx: register_memory(nullptr)");
  }
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                  UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = allocate ? nullptr : data;
  mp.length = size_bytes;
  mp.flags = allocate ? UCP_MEM_MAP_ALLOCATE : 0;
  std::lock_guard<std::mutex> lock(mutex_);
  ucp_mem_h memh = nullptr;
  ucs_status_t s = ucp_mem_map(context_, &mp, &memh);
  if (s != UCS_OK) {
    return make_status(status_code::no_memory, std::string("ucx: ucp_mem_map of ") +
                                                   std::to_string(size_bytes) +
                                                   " bytes: " + ucs_status_string(s));
  }
  if (allocate) {
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    s = ucp_mem_query(memh, &attr);
    if (s != UCS_OK || attr.length < size_bytes) {
      ucp_mem_unmap(context_, memh);
      return make_status(status_code::internal, "ucx: ucp_mem_query failed");
    }
    data = attr.address;
  }
  region_entry e;
  e.r = region{next_id(), static_cast<std::byte*>(data), size_bytes, kind};
  e.memh = memh;
  e.allocated = allocate;
  region r = e.r;
  regions_.emplace(r.id, e);
  return r;
}

result<region> ucx_engine::register_memory(void* data, std::size_t size_bytes, memory_kind kind) {
  return map_memory(data, size_bytes, kind, false);
}

result<region> ucx_engine::allocate_memory(std::size_t size_bytes, memory_kind kind) {
  return map_memory(nullptr, size_bytes, kind, true);
}

status ucx_engine::release_memory(const region& r) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = regions_.find(r.id);
  if (it == regions_.end()) {
    return make_status(status_code::invalid_argument,
                       "ucx: unknown region " + std::to_string(r.id));
  }
  if (it->second.busy > 0) {
    return make_status(status_code::busy, "ucx: region " + std::to_string(r.id) + " is used by " +
                                              std::to_string(it->second.busy) + " transfers");
  }
  ucp_mem_unmap(context_, it->second.memh);
  regions_.erase(it);
  return ok_status();
}

result<bytes> ucx_engine::describe(const region& r) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = regions_.find(r.id);
  if (it == regions_.end()) {
    return make_status(status_code::invalid_argument,
                       "ucx: unknown region " + std::to_string(r.id));
  }
  void* rkey = nullptr;
  std::size_t rkey_size = 0;
  ucs_status_t s = ucp_rkey_pack(context_, it->second.memh, &rkey, &rkey_size);
  if (s != UCS_OK) return from_ucs(s, "ucx: ucp_rkey_pack");
  byte_writer w;
  w.u64(reinterpret_cast<std::uintptr_t>(it->second.r.data));
  w.u64(it->second.r.size_bytes);
  w.blob({static_cast<const std::byte*>(rkey), rkey_size});
  ucp_rkey_buffer_release(rkey);
  return transport::internal::seal(envelope_kind::ucx_region, w.out());
}

// -- peers ------------------------------------------------------------------------------------

result<bytes> ucx_engine::local_address() {
  std::lock_guard<std::mutex> lock(mutex_);
  ucp_address_t* addr = nullptr;
  std::size_t len = 0;
  ucs_status_t s = ucp_worker_get_address(worker_, &addr, &len);
  if (s != UCS_OK) return from_ucs(s, "ucx: ucp_worker_get_address");
  bytes out = transport::internal::seal(envelope_kind::ucx_address,
                                        {reinterpret_cast<const std::byte*>(addr), len});
  ucp_worker_release_address(worker_, addr);
  return out;
}

result<peer_handle> ucx_engine::connect(std::span<const std::byte> address) {
  auto payload = transport::internal::open(envelope_kind::ucx_address, address);
  if (!payload) return payload.error();
  // ucp_ep_create reads the address in place; copy it into aligned storage first.
  std::vector<std::uint64_t> aligned((payload->size() + 7) / 8);
  std::memcpy(aligned.data(), payload->data(), payload->size());
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(aligned.data());
  ep.err_mode = peer_error_mode_ ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  ep.err_handler.cb = ep_error_cb;
  ep.err_handler.arg = this;
  std::lock_guard<std::mutex> lock(mutex_);
  ucp_ep_h h = nullptr;
  ucs_status_t s = ucp_ep_create(worker_, &ep, &h);
  if (s != UCS_OK) {
    return make_status(
        code_of(s) == status_code::io_error ? status_code::peer_unreachable : code_of(s),
        std::string("ucx: ucp_ep_create: ") + ucs_status_string(s));
  }
  std::uint64_t id = next_id();
  peers_.emplace(id, peer_entry{h, false, {}});
  wake_progress();  // the endpoint's wire-up moves on progress
  return peer_handle{id};
}

status ucx_engine::disconnect(peer_handle peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = peers_.find(peer.id);
  if (it == peers_.end()) {
    return make_status(status_code::invalid_argument,
                       "ucx: unknown peer " + std::to_string(peer.id));
  }
  std::vector<op*> live;
  for (auto& [id, o] : ops_) {
    if (o->peer == peer.id) live.push_back(o.get());
  }
  for (op* o : live) abort_op(o, make_status(status_code::canceled, "ucx: peer disconnected"));
  for (auto r = remotes_.begin(); r != remotes_.end();) {
    if (r->second.peer == peer.id) {
      ucp_rkey_destroy(r->second.rkey);
      r = remotes_.erase(r);
    } else {
      ++r;
    }
  }
  close_endpoint(peer.id, it->second);
  peers_.erase(it);
  wake_progress();  // aborted transfers' completions and the close move on progress
  return ok_status();
}

result<remote_region> ucx_engine::import_remote(peer_handle peer,
                                                std::span<const std::byte> descriptor) {
  auto payload = transport::internal::open(envelope_kind::ucx_region, descriptor);
  if (!payload) return payload.error();
  byte_reader rd(*payload);
  std::uint64_t address = 0, size = 0;
  std::span<const std::byte> rkey_bytes;
  if (!rd.u64(address) || !rd.u64(size) || !rd.blob(rkey_bytes) || !rd.at_end() ||
      rkey_bytes.empty()) {
    return make_status(status_code::invalid_argument, "ucx: malformed region descriptor");
  }
  std::vector<std::uint64_t> aligned((rkey_bytes.size() + 7) / 8);
  std::memcpy(aligned.data(), rkey_bytes.data(), rkey_bytes.size());
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = peers_.find(peer.id);
  if (it == peers_.end()) {
    return make_status(status_code::invalid_argument,
                       "ucx: unknown peer " + std::to_string(peer.id));
  }
  ucp_rkey_h rkey = nullptr;
  ucs_status_t s = ucp_ep_rkey_unpack(it->second.ep, aligned.data(), &rkey);
  if (s != UCS_OK) {
    return make_status(status_code::invalid_argument,
                       std::string("ucx: ucp_ep_rkey_unpack: ") + ucs_status_string(s));
  }
  std::uint64_t id = next_id();
  remotes_.emplace(id, remote_entry{peer.id, rkey, address, size});
  return remote_region{id, size};
}

status ucx_engine::release_remote(remote_region remote) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = remotes_.find(remote.id);
  if (it == remotes_.end()) {
    return make_status(status_code::invalid_argument,
                       "ucx: unknown remote region " + std::to_string(remote.id));
  }
  ucp_rkey_destroy(it->second.rkey);
  remotes_.erase(it);
  return ok_status();
}

}  // namespace internal

result<std::unique_ptr<engine>> make_engine(const engine_config& config) {
  auto e = std::make_unique<internal::ucx_engine>(config);
  status s = e->init();
  if (!s.ok()) return s;
  return std::unique_ptr<engine>(std::move(e));
}
}  // namespace weft::transport::ucx
