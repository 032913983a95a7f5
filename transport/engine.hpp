#pragma once
/// The data-plane engine interface: registered memory, peers, one-sided and tagged transfers.
///
/// Control plane and data plane are separate layers: actors exchange small descriptors (worker
/// addresses, remote region descriptors — plain bytes), the engine moves the bulk bytes. A typical
/// exchange between processes A (source) and B (target):
///
///   B: auto buf  = eng->allocate_memory(n);            // or register_memory(ptr, n)
///      auto desc = eng->describe(*buf);                // bytes -> actor message to A
///      auto addr = eng->local_address();               // bytes -> actor message to A
///   A: auto peer = eng->connect(addr);
///      auto rr   = eng->import_remote(*peer, desc);
///      auto t    = eng->put({.peer=*peer, .local=src, .remote=*rr, .size_bytes=n}, on_done);
///      eng->wait(*t);                                  // or just let on_done fire
///
/// Thread safety: every member function is thread-safe. Completion callbacks run on the thread
/// that drives progress (the engine's progress thread in progress_mode::thread, otherwise the
/// caller of progress()/wait()); they may start new transfers but must not block, and must not
/// call wait() (in progress_mode::thread that would wait for the thread running the callback).
/// Errors: no exception leaves an engine. Immediate errors come back as a non-ok result and the
/// callback is then never called; a started transfer calls its callback exactly once.
/// Deadlines: every transfer has one (options.timeout_ms, or the engine default); on expiry it
/// is canceled and completes with status_code::timeout. A transfer never hangs.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "transport/status.hpp"
#include "transport/transfer.hpp"

namespace weft::transport {

/// Opaque bytes that the control plane carries between processes (addresses, descriptors).
using bytes = std::vector<std::byte>;

/// Where a region lives.
enum class memory_kind { host, gpu };

/// Who drives the backend's progress engine.
enum class progress_mode {
  thread,  ///< the engine runs its own progress thread (default)
  manual,  ///< the user calls progress() (or wait()); nothing moves otherwise
};

/// What an engine can do; callers check this instead of the engine's name.
struct capabilities {
  std::string name;                    ///< registry name: "ucx", "inproc", "nccl", "fault:ucx"
  bool one_sided = false;              ///< put/get into remote regions
  bool tagged = false;                 ///< tagged send/recv
  bool collectives = false;            ///< broadcast / all_reduce over a fixed group
  bool inter_process = false;          ///< peers may live in other processes / hosts
  bool gpu_memory = false;             ///< regions may be device memory
  bool needs_target_progress = false;  ///< a put into ordinary registered memory completes only
                                       ///< while the target progresses (UCX over tcp)
};

/// Engine construction parameters. Backend-specific keys live in `params` ("ucx.tls", ...):
/// each backend documents its keys and rejects unknown ones with invalid_argument.
struct engine_config {
  progress_mode progress = progress_mode::thread;
  std::uint32_t default_timeout_ms = 30'000;  ///< deadline for transfers that set none
  std::map<std::string, std::string> params;
};

/// A local memory region known to one engine. A value type; the engine owns the registration.
struct region {
  std::uint64_t id = 0;       ///< 0 = invalid
  std::byte* data = nullptr;  ///< host pointer, or device pointer for memory_kind::gpu
  std::size_t size_bytes = 0;
  memory_kind kind = memory_kind::host;
};

/// A connected peer endpoint. 0 = invalid.
struct peer_handle {
  std::uint64_t id = 0;
};

/// A remote region imported from a descriptor, usable with one peer.
struct remote_region {
  std::uint64_t id = 0;  ///< 0 = invalid
  std::size_t size_bytes = 0;
};

/// Per-transfer options.
struct transfer_options {
  std::uint32_t timeout_ms = 0;  ///< 0 = engine_config::default_timeout_ms
};

/// A one-sided put (local -> remote) or get (remote -> local).
struct rma_request {
  peer_handle peer{};
  region local{};
  std::size_t local_offset_bytes = 0;
  remote_region remote{};
  std::size_t remote_offset_bytes = 0;
  std::size_t size_bytes = 0;
  transfer_options options{};
};

/// One contiguous piece of a batched put or get.
struct rma_segment {
  region local{};
  std::size_t local_offset_bytes = 0;
  remote_region remote{};
  std::size_t remote_offset_bytes = 0;
  std::size_t size_bytes = 0;
};

/// Several segments with one peer moved as one transfer (e.g. the KV blocks of one request):
/// validated all-or-nothing before any byte moves, one completion for the whole batch.
struct rma_batch_request {
  peer_handle peer{};
  std::vector<rma_segment> segments{};
  transfer_options options{};
};

/// A tagged send of local bytes to a peer.
struct send_request {
  peer_handle peer{};
  tag_t tag = 0;
  region local{};
  std::size_t offset_bytes = 0;
  std::size_t size_bytes = 0;
  transfer_options options{};
};

/// A tagged receive into local bytes: matches (sender_tag & tag_mask) == (tag & tag_mask).
/// `peer` is ignored by engines that match on tags only (ucx, inproc); engines without tags
/// (nccl) match on the peer instead.
struct recv_request {
  tag_t tag = 0;
  tag_t tag_mask = ~tag_t{0};
  peer_handle peer{};
  region local{};
  std::size_t offset_bytes = 0;
  std::size_t size_bytes = 0;  ///< capacity; a larger message fails with io_error
  transfer_options options{};
};

enum class data_type { f32, f16, bf16, f64, i32, i64, u8 };
enum class reduce_op { sum, prod, min, max, avg };

/// A collective over the engine's group: broadcast (from root_rank) or all_reduce.
struct collective_request {
  region send{};
  std::size_t send_offset_bytes = 0;
  region recv{};
  std::size_t recv_offset_bytes = 0;
  std::size_t count = 0;  ///< elements, not bytes
  data_type type = data_type::f32;
  reduce_op op = reduce_op::sum;
  int root_rank = 0;
  transfer_options options{};
};

/// Size in bytes of one element of `t`.
std::size_t size_of(data_type t);

/// The abstract engine. See the file comment for the protocol, threading and error contract.
class engine {
 public:
  virtual ~engine() = default;
  engine() = default;
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  /// What this engine can do.
  virtual capabilities caps() const = 0;

  // -- memory -------------------------------------------------------------------------------

  /// Registers caller-owned memory; the caller keeps it alive until release_memory().
  virtual result<region> register_memory(void* data, std::size_t size_bytes,
                                         memory_kind kind = memory_kind::host) = 0;
  /// Allocates registered memory owned by the engine. For UCX over shm this memory is truly
  /// one-sided (puts complete without target progress); prefer it for transfer targets.
  virtual result<region> allocate_memory(std::size_t size_bytes,
                                         memory_kind kind = memory_kind::host) = 0;
  /// Deregisters (and frees, if allocated) a region. Returns busy while transfers use it.
  virtual status release_memory(const region& r) = 0;
  /// The remote descriptor of a region: bytes for the control plane to carry to a peer.
  virtual result<bytes> describe(const region& r) = 0;

  // -- peers --------------------------------------------------------------------------------

  /// This engine's address: bytes for the control plane to carry to peers.
  virtual result<bytes> local_address() = 0;
  /// Connects to a peer given its address bytes. Malformed bytes -> invalid_argument.
  virtual result<peer_handle> connect(std::span<const std::byte> address) = 0;
  /// Closes a peer; its outstanding transfers complete with canceled.
  virtual status disconnect(peer_handle peer) = 0;
  /// Imports a remote region descriptor for use with `peer`. Malformed -> invalid_argument.
  virtual result<remote_region> import_remote(peer_handle peer,
                                              std::span<const std::byte> descriptor) = 0;
  /// Drops an imported remote region.
  virtual status release_remote(remote_region remote) = 0;

  // -- transfers (default: unsupported) -------------------------------------------------------

  /// Copies local bytes into the remote region; completes once the bytes are at the target.
  virtual result<transfer> put(const rma_request& request, completion_fn on_done);
  /// Copies remote bytes into the local region; completes once the bytes are local.
  virtual result<transfer> get(const rma_request& request, completion_fn on_done);
  /// put of every segment; completes (size_bytes = the total) once all bytes are at the target.
  /// An invalid segment fails the whole batch immediately with invalid_argument.
  virtual result<transfer> put_batch(const rma_batch_request& request, completion_fn on_done);
  /// get of every segment; completes once all bytes are local.
  virtual result<transfer> get_batch(const rma_batch_request& request, completion_fn on_done);
  /// Sends local bytes with a tag; completes once the buffer may be reused.
  virtual result<transfer> send(const send_request& request, completion_fn on_done);
  /// Receives a tagged message; completes with the received size and the sender's tag.
  virtual result<transfer> recv(const recv_request& request, completion_fn on_done);
  /// Broadcasts `count` elements from root_rank's send region into everyone's recv region.
  virtual result<transfer> broadcast(const collective_request& request, completion_fn on_done);
  /// Reduces everyone's send region element-wise into everyone's recv region.
  virtual result<transfer> all_reduce(const collective_request& request, completion_fn on_done);

  /// Cancels a transfer; it completes with canceled (unless it already completed).
  virtual status cancel(const transfer& t) = 0;

  // -- progress -------------------------------------------------------------------------------

  /// Drives the backend once: moves bytes, fires callbacks, expires deadlines. Returns the
  /// number of events processed. Safe to call in any progress mode.
  virtual std::size_t progress() = 0;
  virtual progress_mode mode() const = 0;

  /// Blocks until `t` completes (driving progress itself in manual mode) and returns its
  /// completion. Terminates because every transfer has a deadline.
  completion wait(const transfer& t);
};

/// get_batch where the engine has it, else one get per segment — the one fallback every puller
/// uses. `on_done` is called exactly once: with the batch's completion, or with the joint one of
/// the single gets (the first error, the bytes moved by all). Returns the started transfers (one
/// for a batch; cancel them to abandon the pull). If the first transfer cannot be started the error
/// is returned and `on_done` is never called; if a later one cannot, those already started are
/// canceled and `on_done` reports that error once they have ended.
result<std::vector<transfer>> get_all(engine& e, const rma_batch_request& request,
                                      completion_fn on_done);

}  // namespace weft::transport
