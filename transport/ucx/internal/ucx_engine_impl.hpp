#pragma once
// Private to the UCX backend: the engine class, its tables and the UCX callbacks. Included only by
// transport/ucx/*.cpp; the only header of weft that includes ucp headers.

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <ucp/api/ucp.h>

#include "transport/engine.hpp"
#include "transport/internal/envelope.hpp"

namespace weft::transport::ucx::internal {

using transport::internal::byte_reader;
using transport::internal::byte_writer;
using transport::internal::envelope_kind;

inline status_code code_of(ucs_status_t s) {
  switch (s) {
    case UCS_OK:
      return status_code::ok;
    case UCS_ERR_CANCELED:
      return status_code::canceled;
    case UCS_ERR_TIMED_OUT:
      return status_code::timeout;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
      return status_code::peer_unreachable;
    case UCS_ERR_NO_MEMORY:
      return status_code::no_memory;
    case UCS_ERR_INVALID_PARAM:
      return status_code::invalid_argument;
    default:
      return status_code::io_error;
  }
}

inline status from_ucs(ucs_status_t s, const std::string& what) {
  if (s == UCS_OK) return ok_status();
  return make_status(code_of(s), what + ": " + ucs_status_string(s));
}

enum class op_kind { put, get, send, recv };

inline const char* name_of(op_kind k) {
  switch (k) {
    case op_kind::put:
      return "put";
    case op_kind::get:
      return "get";
    case op_kind::send:
      return "send";
    case op_kind::recv:
      return "recv";
  }
  return "?";
}

class ucx_engine;

struct op {
  ucx_engine* owner = nullptr;
  op_kind kind = op_kind::put;
  std::shared_ptr<transfer_state> state;
  clock::time_point deadline;
  std::uint32_t timeout_ms = 0;
  std::uint64_t peer = 0;
  std::vector<std::uint64_t> regions;  // local regions kept busy (one entry per use)
  std::size_t size_bytes = 0;
  std::vector<void*> requests;  // ucp requests; nullptr once UCX returned them
  int pending = 0;              // requests UCX still owns
  void* early = nullptr;        // a request completed inside the *_nbx call that returned it
  ucs_status_t ucs = UCS_OK;    // first error reported by UCX
  ucp_tag_recv_info_t recv_info{};
  bool notified = false;  // the user saw a completion already
};

struct region_entry {
  region r;
  ucp_mem_h memh = nullptr;
  bool allocated = false;
  int busy = 0;  // ops using it
};

struct peer_entry {
  ucp_ep_h ep = nullptr;
  bool failed = false;
  std::string failure;
};

struct remote_entry {
  std::uint64_t peer = 0;
  ucp_rkey_h rkey = nullptr;
  std::uint64_t address = 0;
  std::size_t size_bytes = 0;
};

class ucx_engine final : public engine {
 public:
  explicit ucx_engine(const engine_config& config) : config_(config) {}
  ~ucx_engine() override { shutdown(); }

  status init();

  capabilities caps() const override {
    capabilities c;
    c.name = "ucx";
    c.one_sided = true;
    c.tagged = true;
    c.inter_process = true;
    c.needs_target_progress = true;
    return c;
  }

  result<region> register_memory(void* data, std::size_t size_bytes, memory_kind kind) override;
  result<region> allocate_memory(std::size_t size_bytes, memory_kind kind) override;
  status release_memory(const region& r) override;
  result<bytes> describe(const region& r) override;
  result<bytes> local_address() override;
  result<peer_handle> connect(std::span<const std::byte> address) override;
  status disconnect(peer_handle peer) override;
  result<remote_region> import_remote(peer_handle peer,
                                      std::span<const std::byte> descriptor) override;
  status release_remote(remote_region remote) override;
  result<transfer> put(const rma_request& request, completion_fn on_done) override;
  result<transfer> get(const rma_request& request, completion_fn on_done) override;
  result<transfer> put_batch(const rma_batch_request& request, completion_fn on_done) override;
  result<transfer> get_batch(const rma_batch_request& request, completion_fn on_done) override;
  result<transfer> send(const send_request& request, completion_fn on_done) override;
  result<transfer> recv(const recv_request& request, completion_fn on_done) override;
  status cancel(const transfer& t) override;
  std::size_t progress() override;
  progress_mode mode() const override { return config_.progress; }

  // -- called by UCX callbacks (mutex held) ---------------------------------------------------
  void on_request_done(op* o, void* request, ucs_status_t s);
  void on_peer_error(ucp_ep_h ep, ucs_status_t s);

 private:
  result<region> map_memory(void* data, std::size_t size_bytes, memory_kind kind, bool allocate);
  result<transfer> start_rma(op_kind kind, peer_handle peer, std::span<const rma_segment> segments,
                             const transfer_options& options, completion_fn on_done);
  std::unique_ptr<op> new_op(op_kind kind, std::uint32_t timeout_ms, completion_fn on_done);
  result<transfer> launch(std::unique_ptr<op> o);
  ucp_request_param_t param_for(op* o, ucp_mem_h memh) const;
  void track(op* o, ucs_status_ptr_t p);
  void release_regions(op* o);
  void abort_op(op* o, status why);
  void expire_deadlines();
  void sweep();
  /// Ends the progress thread's wait on the worker's event fd (work was posted from another
  /// thread: its completion is delivered by the next progress()). No-op without a progress thread.
  void wake_progress();
  std::vector<std::pair<std::shared_ptr<transfer_state>, completion>> take_ready();
  void fire(std::vector<std::pair<std::shared_ptr<transfer_state>, completion>> ready);
  void progress_loop();
  bool worker_idle_wait(std::chrono::microseconds max_wait);
  void close_endpoint(std::uint64_t peer_id, const peer_entry& peer);
  void shutdown();
  std::uint64_t next_id() { return next_id_++; }

  engine_config config_;
  std::mutex mutex_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  bool peer_error_mode_ = false;
  std::uint64_t next_id_ = 1;
  std::unordered_map<std::uint64_t, region_entry> regions_;
  std::unordered_map<std::uint64_t, peer_entry> peers_;
  std::unordered_map<std::uint64_t, remote_entry> remotes_;
  std::unordered_map<std::uint64_t, std::unique_ptr<op>> ops_;  // by transfer id
  std::vector<void*> closing_;                                  // ep close requests
  std::vector<std::pair<std::shared_ptr<transfer_state>, completion>> ready_;
  bool sweep_needed_ = false;
  /// Whether something in flight has a deadline or a close to finish (set by progress()): the
  /// progress thread's idle wait is then capped at a few ms, else it sleeps until signalled.
  std::atomic<bool> timed_work_{false};
  std::atomic<bool> stop_{false};
  std::thread progress_thread_;
};

// -- UCX callbacks (user_data / arg carry the op or the engine) -------------------------------

void send_cb(void* request, ucs_status_t s, void* user_data);
void recv_cb(void* request, ucs_status_t s, const ucp_tag_recv_info_t* info, void* user_data);
void ep_error_cb(void* arg, ucp_ep_h ep, ucs_status_t s);
void close_cb(void* request, ucs_status_t s, void* user_data);

}  // namespace weft::transport::ucx::internal
