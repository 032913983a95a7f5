// The NCCL engine. The only translation unit that includes nccl.h (and, for streams/events and
// device memory, the CUDA runtime).
//
// Every operation is enqueued on one stream and followed by an event; progress() polls the
// events in issue order and the communicator's async error. Deadlines: NCCL cannot cancel one
// operation, so a missed deadline aborts the communicator and fails everything in flight.

#include "transport/nccl/nccl_engine.hpp"

#include <atomic>
#include <charconv>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <cuda_runtime.h>
#include <nccl.h>
#include <spdlog/spdlog.h>

#include "transport/internal/envelope.hpp"

namespace weft::transport::nccl {

namespace {

using internal::envelope_kind;

std::string cuda_error(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

status from_nccl(ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess) return ok_status();
  status_code code = status_code::io_error;
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) code = status_code::invalid_argument;
  if (r == ncclRemoteError) code = status_code::peer_unreachable;
  return make_status(code, "nccl: " + what + ": " + ncclGetErrorString(r));
}

bool parse_int(const std::string& s, int& out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc{} && p == s.data() + s.size();
}

ncclDataType_t nccl_type(data_type t) {
  switch (t) {
    case data_type::f32:
      return ncclFloat32;
    case data_type::f16:
      return ncclFloat16;
    case data_type::bf16:
      return ncclBfloat16;
    case data_type::f64:
      return ncclFloat64;
    case data_type::i32:
      return ncclInt32;
    case data_type::i64:
      return ncclInt64;
    case data_type::u8:
      return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(reduce_op op) {
  switch (op) {
    case reduce_op::sum:
      return ncclSum;
    case reduce_op::prod:
      return ncclProd;
    case reduce_op::min:
      return ncclMin;
    case reduce_op::max:
      return ncclMax;
    case reduce_op::avg:
      return ncclAvg;
  }
  return ncclSum;
}

struct settings {
  int rank = -1;
  int world_size = 0;
  int device = 0;
};

struct in_flight {
  std::shared_ptr<transfer_state> state;
  cudaEvent_t done = nullptr;
  clock::time_point deadline;
  std::uint32_t timeout_ms = 0;
  std::size_t size_bytes = 0;
  const char* what = "";
};

using ready_list = std::vector<std::pair<std::shared_ptr<transfer_state>, completion>>;

class nccl_engine final : public engine {
 public:
  nccl_engine(const engine_config& config, settings s) : config_(config), s_(s) {}

  ~nccl_engine() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    ready_list ready;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (comm_ != nullptr) {
        if (!ops_.empty() || settle(ncclCommFinalize(comm_)) != ncclSuccess)
          ncclCommAbort(comm_);
        else
          ncclCommDestroy(comm_);
        comm_ = nullptr;
      }
      fail_all(make_status(status_code::canceled, "nccl: engine shut down"), ready);
      for (auto& [id, r] : regions_) {
        if (r.second) cudaFree(r.first.data);
      }
      if (stream_ != nullptr) cudaStreamDestroy(stream_);
    }
    for (auto& [st, c] : ready) st->finish(std::move(c));
  }

  status init() {
    cudaError_t e = cudaSetDevice(s_.device);
    if (e != cudaSuccess) {
      return make_status(
          status_code::no_device,
          "nccl: cudaSetDevice(" + std::to_string(s_.device) + "): " + cuda_error(e));
    }
    e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    if (e != cudaSuccess)
      return make_status(status_code::io_error, "nccl: stream: " + cuda_error(e));
    if (s_.rank == 0) {
      ncclResult_t r = ncclGetUniqueId(&group_id_);
      if (r != ncclSuccess) return from_nccl(r, "ncclGetUniqueId");
      has_group_id_ = true;
    }
    if (config_.progress == progress_mode::thread) thread_ = std::thread([this] { loop(); });
    return ok_status();
  }

  capabilities caps() const override {
    capabilities c;
    c.name = "nccl";
    c.tagged = true;
    c.collectives = true;
    c.inter_process = true;
    c.gpu_memory = true;
    return c;
  }

  // -- memory ---------------------------------------------------------------------------------

  result<region> register_memory(void* data, std::size_t size_bytes, memory_kind kind) override {
    if (kind != memory_kind::gpu) {
      return make_status(status_code::unsupported, "nccl: regions must be GPU memory");
    }
    if (data == nullptr || size_bytes == 0) {
      return make_status(status_code::invalid_argument, "nccl: empty region");
    }
    return add_region(static_cast<std::byte*>(data), size_bytes, false);
  }

  result<region> allocate_memory(std::size_t size_bytes, memory_kind kind) override {
    if (kind != memory_kind::gpu) {
      return make_status(status_code::unsupported, "nccl: regions must be GPU memory");
    }
    if (size_bytes == 0) return make_status(status_code::invalid_argument, "nccl: empty region");
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, size_bytes);
    if (e != cudaSuccess)
      return make_status(status_code::no_memory, "nccl: cudaMalloc: " + cuda_error(e));
    return add_region(static_cast<std::byte*>(p), size_bytes, true);
  }

  status release_memory(const region& r) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = regions_.find(r.id);
    if (it == regions_.end())
      return make_status(status_code::invalid_argument, "nccl: unknown region");
    if (!ops_.empty()) return make_status(status_code::busy, "nccl: transfers in flight");
    if (it->second.second) cudaFree(it->second.first.data);
    regions_.erase(it);
    return ok_status();
  }

  result<bytes> describe(const region&) override {
    return make_status(status_code::unsupported, "nccl: no one-sided access, nothing to describe");
  }

  // -- group ----------------------------------------------------------------------------------

  result<bytes> local_address() override {
    if (!has_group_id_) {
      return make_status(status_code::unsupported,
                         "nccl: only rank 0 has the group id; others join with connect()");
    }
    internal::byte_writer w;
    w.u64(static_cast<std::uint64_t>(s_.world_size));
    w.blob({reinterpret_cast<const std::byte*>(&group_id_), sizeof group_id_});
    return internal::seal(envelope_kind::nccl_group, w.out());
  }

  result<peer_handle> connect(std::span<const std::byte> address) override {
    auto payload = internal::open(envelope_kind::nccl_group, address);
    if (!payload) return payload.error();
    internal::byte_reader rd(*payload);
    std::uint64_t world = 0;
    std::span<const std::byte> id_bytes;
    if (!rd.u64(world) || !rd.blob(id_bytes) || !rd.at_end() ||
        id_bytes.size() != sizeof(ncclUniqueId)) {
      return make_status(status_code::invalid_argument, "nccl: malformed group id");
    }
    if (world != static_cast<std::uint64_t>(s_.world_size)) {
      return make_status(status_code::invalid_argument, "nccl: group of " + std::to_string(world) +
                                                            " ranks, configured for " +
                                                            std::to_string(s_.world_size));
    }
    ncclUniqueId id;
    std::memcpy(&id, id_bytes.data(), sizeof id);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (comm_ != nullptr || joining_)
        return make_status(status_code::invalid_argument, "nccl: already in a group");
      joining_ = true;
    }
    // Non-blocking init, polled against the deadline: a member that never joins (it died, or
    // never started) fails the call here instead of blocking this thread forever.
    cudaSetDevice(s_.device);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&comm, s_.world_size, id, s_.rank, &cfg);
    const auto deadline = clock::now() + std::chrono::milliseconds(config_.default_timeout_ms);
    while (r == ncclInProgress && clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) break;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    joining_ = false;
    if (r == ncclInProgress) {
      ncclCommAbort(comm);
      return make_status(status_code::timeout,
                         "nccl: ncclCommInitRank: not every rank of " +
                             std::to_string(s_.world_size) + " joined within " +
                             std::to_string(config_.default_timeout_ms) + " ms");
    }
    if (r != ncclSuccess) {
      if (comm != nullptr) ncclCommAbort(comm);
      return from_nccl(r, "ncclCommInitRank");
    }
    comm_ = comm;
    return peer_of_rank(0);
  }

  status disconnect(peer_handle) override {
    return make_status(status_code::unsupported, "nccl: a group is left by destroying the engine");
  }
  result<remote_region> import_remote(peer_handle, std::span<const std::byte>) override {
    return make_status(status_code::unsupported, "nccl: no one-sided access");
  }
  status release_remote(remote_region) override {
    return make_status(status_code::unsupported, "nccl: no one-sided access");
  }

  // -- transfers ------------------------------------------------------------------------------

  result<transfer> send(const send_request& rq, completion_fn on_done) override {
    return point_to_point(rq.peer, rq.local, rq.offset_bytes, rq.size_bytes, rq.options,
                          std::move(on_done), true);
  }

  result<transfer> recv(const recv_request& rq, completion_fn on_done) override {
    return point_to_point(rq.peer, rq.local, rq.offset_bytes, rq.size_bytes, rq.options,
                          std::move(on_done), false);
  }

  result<transfer> broadcast(const collective_request& rq, completion_fn on_done) override {
    return collective(rq, std::move(on_done), true);
  }

  result<transfer> all_reduce(const collective_request& rq, completion_fn on_done) override {
    return collective(rq, std::move(on_done), false);
  }

  status cancel(const transfer&) override {
    return make_status(
        status_code::unsupported,
        "nccl: operations cannot be canceled one by one (a deadline aborts the group)");
  }

  std::size_t progress() override {
    ready_list ready;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      poll(ready);
    }
    std::size_t n = ready.size();
    for (auto& [st, c] : ready) st->finish(std::move(c));
    return n;
  }

  progress_mode mode() const override { return config_.progress; }

 private:
  region add_region(std::byte* p, std::size_t size, bool allocated) {
    std::lock_guard<std::mutex> lock(mutex_);
    region r{next_id_++, p, size, memory_kind::gpu};
    regions_[r.id] = {r, allocated};
    return r;
  }

  // mutex_ held.
  result<std::byte*> span_of(const region& r, std::size_t offset, std::size_t size) const {
    auto it = regions_.find(r.id);
    if (it == regions_.end())
      return make_status(status_code::invalid_argument, "nccl: unknown region");
    const region& known = it->second.first;
    if (offset > known.size_bytes || size > known.size_bytes - offset) {
      return make_status(status_code::invalid_argument, "nccl: span outside the region");
    }
    return known.data + offset;
  }

  // mutex_ held.
  status usable() const {
    if (comm_ == nullptr)
      return make_status(status_code::invalid_argument, "nccl: not in a group (connect first)");
    if (aborted_)
      return make_status(status_code::peer_unreachable, "nccl: communicator was aborted");
    return ok_status();
  }

  // mutex_ held. Records the completion event of an operation just enqueued.
  result<transfer> track(const char* what, std::size_t size, const transfer_options& options,
                         completion_fn on_done) {
    in_flight f;
    f.what = what;
    f.size_bytes = size;
    f.timeout_ms = options.timeout_ms ? options.timeout_ms : config_.default_timeout_ms;
    f.deadline = clock::now() + std::chrono::milliseconds(f.timeout_ms);
    cudaError_t e = cudaEventCreateWithFlags(&f.done, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(f.done, stream_);
    if (e != cudaSuccess) {
      if (f.done != nullptr) cudaEventDestroy(f.done);
      return make_status(status_code::io_error, std::string("nccl: event: ") + cuda_error(e));
    }
    f.state = make_transfer_state(std::move(on_done));
    transfer t(f.state);
    ops_.push_back(std::move(f));
    return t;
  }

  result<transfer> point_to_point(peer_handle peer, const region& local, std::size_t offset,
                                  std::size_t size, const transfer_options& options,
                                  completion_fn on_done, bool is_send) {
    std::lock_guard<std::mutex> lock(mutex_);
    status s = usable();
    if (!s.ok()) return s;
    if (peer.id == 0 || peer.id > static_cast<std::uint64_t>(s_.world_size)) {
      return make_status(status_code::invalid_argument, "nccl: peer is not a rank of the group");
    }
    auto p = span_of(local, offset, size);
    if (!p) return p.error();
    int rank = static_cast<int>(peer.id - 1);
    ncclResult_t r = settle(is_send ? ncclSend(*p, size, ncclUint8, rank, comm_, stream_)
                                    : ncclRecv(*p, size, ncclUint8, rank, comm_, stream_));
    if (r != ncclSuccess) return from_nccl(r, is_send ? "ncclSend" : "ncclRecv");
    return track(is_send ? "send" : "recv", size, options, std::move(on_done));
  }

  result<transfer> collective(const collective_request& rq, completion_fn on_done, bool bcast) {
    std::lock_guard<std::mutex> lock(mutex_);
    status s = usable();
    if (!s.ok()) return s;
    std::size_t size = rq.count * size_of(rq.type);
    auto recv = span_of(rq.recv, rq.recv_offset_bytes, size);
    if (!recv) return recv.error();
    auto send = span_of(rq.send, rq.send_offset_bytes, size);
    if (!send && !(bcast && s_.rank != rq.root_rank)) return send.error();
    if (rq.root_rank < 0 || rq.root_rank >= s_.world_size) {
      return make_status(status_code::invalid_argument, "nccl: root rank outside the group");
    }
    const void* src = send ? static_cast<const void*>(*send) : nullptr;
    ncclResult_t r = settle(bcast ? ncclBroadcast(src, *recv, rq.count, nccl_type(rq.type),
                                                  rq.root_rank, comm_, stream_)
                                  : ncclAllReduce(src, *recv, rq.count, nccl_type(rq.type),
                                                  nccl_op(rq.op), comm_, stream_));
    if (r != ncclSuccess) return from_nccl(r, bcast ? "ncclBroadcast" : "ncclAllReduce");
    return track(bcast ? "broadcast" : "all_reduce", size, rq.options, std::move(on_done));
  }

  // mutex_ held. The communicator is non-blocking: a call may return ncclInProgress while NCCL
  // finishes enqueuing it, and nothing else may be called on the communicator until it has.
  ncclResult_t settle(ncclResult_t r) {
    while (r == ncclInProgress) {
      std::this_thread::yield();
      if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) break;
    }
    return r;
  }

  // mutex_ held.
  void fail_all(const status& why, ready_list& ready) {
    for (auto& f : ops_) {
      if (f.done != nullptr) cudaEventDestroy(f.done);
      ready.emplace_back(f.state, completion{why, 0, 0});
    }
    ops_.clear();
  }

  // mutex_ held. Operations complete in stream order.
  void poll(ready_list& ready) {
    while (!ops_.empty()) {
      in_flight& f = ops_.front();
      cudaError_t e = cudaEventQuery(f.done);
      if (e == cudaErrorNotReady) break;
      cudaEventDestroy(f.done);
      if (e == cudaSuccess) {
        ready.emplace_back(f.state, completion{ok_status(), f.size_bytes, 0});
      } else {
        ready.emplace_back(
            f.state, completion{make_status(status_code::io_error,
                                            std::string("nccl: ") + f.what + ": " + cuda_error(e)),
                                0, 0});
      }
      ops_.pop_front();
    }
    if (ops_.empty() || comm_ == nullptr) return;
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      abort_group(from_nccl(async, "asynchronous error"), ready);
      return;
    }
    const in_flight& head = ops_.front();
    if (clock::now() >= head.deadline) {
      abort_group(make_status(status_code::timeout,
                              std::string("nccl: ") + head.what + " of " +
                                  std::to_string(head.size_bytes) + " bytes missed its " +
                                  std::to_string(head.timeout_ms) + " ms deadline; group aborted"),
                  ready);
    }
  }

  // mutex_ held.
  void abort_group(const status& why, ready_list& ready) {
    spdlog::error("{}", why.to_string());
    ncclCommAbort(comm_);
    comm_ = nullptr;
    aborted_ = true;
    fail_all(why, ready);
  }

  void loop() {
    cudaSetDevice(s_.device);
    while (!stop_) {
      if (progress() == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  engine_config config_;
  settings s_;
  std::mutex mutex_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  ncclUniqueId group_id_{};
  bool has_group_id_ = false;
  bool joining_ = false;
  bool aborted_ = false;
  std::uint64_t next_id_ = 1;
  std::unordered_map<std::uint64_t, std::pair<region, bool>> regions_;  // region, allocated
  std::deque<in_flight> ops_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

result<std::unique_ptr<engine>> make_engine(const engine_config& config) {
  settings s;
  for (const auto& [key, value] : config.params) {
    int* target = key == "nccl.rank"         ? &s.rank
                  : key == "nccl.world_size" ? &s.world_size
                  : key == "nccl.device"     ? &s.device
                                             : nullptr;
    if (target == nullptr) {
      return make_status(status_code::invalid_argument, "unknown nccl engine param '" + key + "'");
    }
    if (!parse_int(value, *target)) {
      return make_status(status_code::invalid_argument,
                         "nccl param " + key + ": bad value '" + value + "'");
    }
  }
  // Without a GPU cudaGetDeviceCount fails (error 35 here) and leaves its output untouched.
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    return make_status(status_code::no_device,
                       "nccl: no CUDA device visible (cudaGetDeviceCount: " +
                           (e != cudaSuccess ? cuda_error(e) : std::string("0 devices")) + ")");
  }
  if (s.world_size < 1 || s.rank < 0 || s.rank >= s.world_size) {
    return make_status(status_code::invalid_argument,
                       "nccl: needs nccl.rank in [0, nccl.world_size) and nccl.world_size >= 1");
  }
  if (s.device < 0 || s.device >= devices) {
    return make_status(status_code::no_device, "nccl: device " + std::to_string(s.device) + " of " +
                                                   std::to_string(devices));
  }
  auto eng = std::make_unique<nccl_engine>(config, s);
  status st = eng->init();
  if (!st.ok()) return st;
  return std::unique_ptr<engine>(std::move(eng));
}

}  // namespace weft::transport::nccl
