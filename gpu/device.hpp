#pragma once
/// Devices: memory, streams, copies and the kernels, behind one small interface plus a registry.
///
/// The CPU device is always registered and is the reference; the CUDA device is registered when the
/// build has WEFT_WITH_CUDA and reports `unsupported` at creation when no GPU is present.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpu/compute_ops.hpp"
#include "gpu/status.hpp"

namespace weft::gpu {

/// Kind of device.
enum class device_kind { cpu, cuda };

/// Whether the host can dereference device pointers.
enum class memory_visibility { host_visible, device_only };

/// What a device can do (declared once, read by the model and the engine).
struct device_capabilities {
  device_kind kind = device_kind::cpu;
  std::string name;  ///< e.g. "cpu (avx2, 2 threads)".
  size_t total_memory_bytes = 0;
  memory_visibility memory = memory_visibility::host_visible;
  int n_compute_threads = 1;
  std::vector<ggml_type> weight_types;  ///< Weight types `matmul` accepts.
};

/// A block of device memory. Owned by whoever allocated it; release it on the same device.
struct device_buffer {
  void* data = nullptr;
  size_t size_bytes = 0;
};

/// An ordered queue of device work. Stream 0 is the compute stream.
using stream_id = int32_t;

/// How a device is created.
struct device_config {
  int n_threads = 0;     ///< CPU: compute threads (0 = all cores). Ignored by GPUs.
  int device_index = 0;  ///< GPU ordinal.
};

namespace train {
class train_kernels;
}

/// A compute device. Not thread-safe: one owner drives it.
class device {
 public:
  virtual ~device() = default;

  virtual const device_capabilities& capabilities() const = 0;

  /// Allocates `size_bytes` of device memory (64-byte aligned, zero-filled).
  virtual result<device_buffer> allocate(size_t size_bytes) = 0;
  /// Frees a buffer from `allocate`; a null buffer is ignored.
  virtual void release(device_buffer buffer) = 0;

  /// Creates a stream for copies that overlap compute.
  virtual result<stream_id> create_stream() = 0;
  /// Blocks until all work enqueued on `stream` is done.
  virtual status synchronize(stream_id stream = 0) = 0;

  /// Enqueues a copy of `size_bytes` from host memory to device memory.
  virtual status copy_to_device(void* dst, const void* src, size_t size_bytes,
                                stream_id stream = 0) = 0;
  /// Enqueues a copy from device memory to host memory.
  virtual status copy_to_host(void* dst, const void* src, size_t size_bytes,
                              stream_id stream = 0) = 0;
  /// Enqueues a copy within device memory.
  virtual status copy_on_device(void* dst, const void* src, size_t size_bytes,
                                stream_id stream = 0) = 0;

  /// The kernels of this device (valid as long as the device lives).
  virtual compute_ops& ops() = 0;
  /// The trainer's ops on this device (gpu/train/train_kernels.hpp), or null where the backend has
  /// none. Valid as long as the device lives.
  virtual train::train_kernels* training() { return nullptr; }

  /// Marks the start/end of a burst of ops (one forward pass): a CPU device keeps its workers
  /// spinning in between. Nestable; no-op on devices that do not need it.
  virtual void begin_burst() {}
  virtual void end_burst() {}

  /// Runs fn(i) for every i in [0, n) on the device's host threads (CPU: its compute threads;
  /// elsewhere: in order on the caller), returning when all are done: host work between passes,
  /// such as sampling each sequence's token. fn must not depend on which thread runs which i.
  virtual void parallel_host(int64_t n, const std::function<void(int64_t)>& fn) {
    for (int64_t i = 0; i < n; ++i) fn(i);
  }
  /// CPU: use `n` compute threads from the next op on (clamped to [1, max_compute_threads()]);
  /// results do not depend on the count (docs/engine.md). A survivor of a worker's death borrows
  /// the dead worker's cores this way while it rebuilds migrated requests. No-op on GPUs.
  virtual void set_compute_threads(int /*n*/) {}
  /// The most threads set_compute_threads can give (CPU: at least the machine's cores).
  virtual int max_compute_threads() const { return capabilities().n_compute_threads; }
};

/// Creates devices by name ("cpu", "cuda").
using device_factory = std::function<result<std::unique_ptr<device>>(const device_config&)>;
/// How many devices of a backend this host has (0: none usable).
using device_counter = std::function<int()>;

/// Process-wide registry of device backends. Thread-safe.
class device_registry {
 public:
  /// The registry, with the built-in backends registered.
  static device_registry& instance();

  /// Registers (or replaces) a backend; `count` says how many devices it has (none: one).
  void add(const std::string& name, device_kind kind, device_factory factory,
           device_counter count = nullptr);
  /// Creates a device of backend `name`; not_found for an unknown name.
  result<std::unique_ptr<device>> create(const std::string& name,
                                         const device_config& config = {}) const;
  /// Devices of backend `name` on this host (BACKEND:0 .. BACKEND:count-1); 0 for an unknown one.
  int count(const std::string& name) const;
  /// Names of the registered backends.
  std::vector<std::string> names() const;
  /// Creates the device a user names: BACKEND or BACKEND:INDEX ("cpu", "cuda", "cuda:1");
  /// `threads` is the CPU backend's thread count (0: all cores). An unknown backend or a
  /// malformed name is invalid_argument naming the backends there are.
  result<std::unique_ptr<device>> open(const std::string& spec, int threads = 0) const;

 private:
  device_registry() = default;
  struct entry {
    std::string name;
    device_kind kind;
    device_factory factory;
    device_counter count;
  };
  std::vector<entry> entries_;
};

/// RAII guard for device::begin_burst / end_burst.
class burst_scope {
 public:
  explicit burst_scope(device& d) : d_(d) { d_.begin_burst(); }
  ~burst_scope() { d_.end_burst(); }
  burst_scope(const burst_scope&) = delete;
  burst_scope& operator=(const burst_scope&) = delete;

 private:
  device& d_;
};

}  // namespace weft::gpu
