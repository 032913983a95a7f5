#include "gpu/cpu/cpu_device.hpp"

#include <sys/mman.h>

#include <cblas.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include "gpu/cpu/attention.hpp"
#include "gpu/cpu/elementwise.hpp"
#include "gpu/cpu/matmul.hpp"
#include "gpu/cpu/quant_dot.hpp"
#include "gpu/cpu/thread_pool.hpp"
#include "gpu/train/train_kernels.hpp"

namespace weft::gpu::cpu {

namespace {

// Element-wise ops below this size run on the calling thread: a fork-join costs more.
constexpr int64_t min_parallel_elems = 16384;

class cpu_ops final : public compute_ops {
 public:
  explicit cpu_ops(thread_pool& pool)
      : pool_(pool), attn_scratch_(static_cast<size_t>(pool.size())) {}

  status matmul(const tensor_view& w, const float* x, int64_t n_tokens, float* y) override {
    return cpu::matmul(pool_, mm_scratch_, w, x, n_tokens, y);
  }

  status matmul_multi(std::span<const tensor_view> ws, const float* x, int64_t n_tokens,
                      std::span<float* const> ys) override {
    return cpu::matmul_multi(pool_, mm_scratch_, ws, x, n_tokens, ys);
  }

  size_t packed_weight_bytes(const tensor_view& w) override { return cpu::packed_weight_bytes(w); }

  status pack_weight(const tensor_view& w, void* dst) override {
    return cpu::pack_weight(pool_, w, dst);
  }

  status rms_norm(const float* x, const float* weight, float* y, int64_t n_tokens, int64_t dim,
                  float eps) override {
    if (n_tokens * dim < min_parallel_elems) {
      rms_norm_rows(x, weight, y, 0, n_tokens, dim, eps);
    } else {
      pool_.parallel([&](int i, int n) {
        const auto [b, e] = split_range(n_tokens, n, i);
        rms_norm_rows(x, weight, y, b, e, dim, eps);
      });
    }
    return {};
  }

  status rope(float* x, const int32_t* positions, int64_t n_tokens, int64_t n_heads,
              int64_t head_dim, const rope_config& config) override {
    if (config.n_dims <= 0 || config.n_dims > head_dim || config.n_dims % 2 != 0) {
      return {status_code::invalid_argument, "rope: bad n_dims"};
    }
    auto body = [&](int64_t b, int64_t e) {
      std::vector<float> cache(static_cast<size_t>(config.n_dims));
      for (int64_t t = b; t < e; ++t) {
        rope_cache(cache.data(), positions[t], config);
        for (int64_t h = 0; h < n_heads; ++h)
          rope_head(x + (t * n_heads + h) * head_dim, cache.data(), config);
      }
    };
    if (n_tokens < 4) {
      body(0, n_tokens);
    } else {
      pool_.parallel([&](int i, int n) {
        const auto [b, e] = split_range(n_tokens, n, i);
        body(b, e);
      });
    }
    return {};
  }

  status swiglu(const float* gate, const float* up, float* y, int64_t n) override {
    if (n < min_parallel_elems) {
      swiglu_range(gate, up, y, 0, n);
    } else {
      pool_.parallel([&](int i, int k) {
        const auto [b, e] = split_range(n, k, i);
        swiglu_range(gate, up, y, b, e);
      });
    }
    return {};
  }

  status add(const float* a, const float* b, float* y, int64_t n) override {
    add_range(a, b, y, 0, n);
    return {};
  }

  status get_rows(const tensor_view& table, const int32_t* ids, int64_t n, float* y) override {
    for (int64_t i = 0; i < n; ++i) {
      if (auto st = get_row(table, ids[i], y + i * table.n_cols); !st.ok()) return st;
    }
    return {};
  }

  status kv_store(const kv_store_batch& b) override {
    for (int64_t t = 0; t < b.n_tokens; ++t) {
      const int64_t slot = b.slots[t];
      float_to_half_row(b.k + t * b.row_elems, b.k_cache + slot * b.row_elems, b.row_elems);
      float_to_half_row(b.v + t * b.row_elems, b.v_cache + slot * b.row_elems, b.row_elems);
    }
    return {};
  }

  status attention(const attention_batch& b) override {
    if (b.n_kv_heads <= 0 || b.n_heads % b.n_kv_heads != 0) {
      return {status_code::invalid_argument, "attention: n_heads must be a multiple of n_kv_heads"};
    }
    pool_.parallel(
        [&](int i, int n) { attention_tasks(b, attn_scratch_[static_cast<size_t>(i)], i, n); });
    return {};
  }

  status softmax(float* x, int64_t n_rows, int64_t n) override {
    for (int64_t r = 0; r < n_rows; ++r) softmax_row(x + r * n, n);
    return {};
  }

  status gather_rows(const float* src, const int32_t* ids, int64_t n, int64_t dim,
                     float* dst) override {
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(dst + i * dim, src + ids[i] * dim, sizeof(float) * dim);
    return {};
  }

  status scatter_rows(const float* src, const int32_t* ids, int64_t n, int64_t dim,
                      float* dst) override {
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(dst + ids[i] * dim, src + i * dim, sizeof(float) * dim);
    return {};
  }

  status weighted_sum(const float* rows, const float* weights, int64_t n_tokens, int64_t k,
                      int64_t dim, float* out) override {
    for (int64_t t = 0; t < n_tokens; ++t) {
      float* o = out + t * dim;
      for (int64_t j = 0; j < k; ++j) {
        const float w = weights[t * k + j];
        const float* r = rows + (t * k + j) * dim;
        if (j == 0) {
          for (int64_t i = 0; i < dim; ++i) o[i] = r[i] * w;
        } else {
          for (int64_t i = 0; i < dim; ++i) o[i] = o[i] + r[i] * w;
        }
      }
    }
    return {};
  }

 private:
  thread_pool& pool_;
  matmul_scratch mm_scratch_;
  std::vector<attention_scratch> attn_scratch_;
};

class cpu_device final : public device {
 public:
  /// `n_threads` compute threads; the pool holds up to `max_threads` (idle ones block) so that
  /// set_compute_threads can lend the worker more cores for a while.
  cpu_device(int n_threads, int max_threads) : pool_(max_threads, n_threads), ops_(pool_) {
    caps_.kind = device_kind::cpu;
    const auto kernel = quant_matmul_kernel_in_use();  // checked by make_cpu_device
    caps_.name = std::string{"cpu ("} +
                 (kernel && *kernel != quant_matmul_kernel::ggml
                      ? std::string{quant_matmul_kernel_name(*kernel)} + " matmuls, "
                      : std::string{}) +
                 quant_kernel_path() + ", ggml " + ggml_simd_name(ggml_simd_layout()) +
                 " numerics, " + std::to_string(n_threads) + " threads)";
    caps_.memory = memory_visibility::host_visible;
    caps_.n_compute_threads = n_threads;
    caps_.weight_types = {ggml_type::f32,  ggml_type::f16,  ggml_type::bf16,
                          ggml_type::q8_0, ggml_type::q4_0, ggml_type::q4_1};
  }

  const device_capabilities& capabilities() const override { return caps_; }

  void set_compute_threads(int n) override { pool_.request_active(n); }
  int max_compute_threads() const override { return pool_.size(); }

  // From 4 MiB (the model's packed weights, KV caches) in 2 MiB-aligned memory advised
  // MADV_HUGEPAGE: fewer TLB misses for what every step streams through (where the kernel's
  // transparent huge pages are `madvise` or `always`; elsewhere the advice does nothing).
  result<device_buffer> allocate(size_t size_bytes) override {
    constexpr size_t huge = size_t{2} << 20;
    const bool large = size_bytes >= 2 * huge;
    const size_t align = large ? huge : 64;
    const size_t rounded = (std::max<size_t>(size_bytes, 1) + align - 1) / align * align;
    void* p = std::aligned_alloc(align, rounded);
    if (p == nullptr)
      return status{status_code::out_of_memory,
                    "cpu: cannot allocate " + std::to_string(size_bytes)};
    if (large) (void)::madvise(p, rounded, MADV_HUGEPAGE);
    std::memset(p, 0, rounded);
    return device_buffer{p, size_bytes};
  }

  void release(device_buffer buffer) override { std::free(buffer.data); }

  result<stream_id> create_stream() override { return stream_id{next_stream_++}; }
  status synchronize(stream_id) override {
    return {};
  }  // CPU work completes before a call returns.

  status copy_to_device(void* dst, const void* src, size_t n, stream_id) override {
    return copy(dst, src, n);
  }
  status copy_to_host(void* dst, const void* src, size_t n, stream_id) override {
    return copy(dst, src, n);
  }
  status copy_on_device(void* dst, const void* src, size_t n, stream_id) override {
    return copy(dst, src, n);
  }

  compute_ops& ops() override { return ops_; }
  train::train_kernels* training() override { return &train_; }

  void parallel_host(int64_t n, const std::function<void(int64_t)>& fn) override {
    if (n <= 1) {
      if (n == 1) fn(0);
      return;
    }
    pool_.parallel([&](int t, int nt) {
      for (int64_t i = t; i < n; i += nt) fn(i);
    });
  }

  void begin_burst() override {
    if (burst_depth_++ == 0) spin_ = std::make_unique<thread_pool::spin_scope>(pool_);
  }
  void end_burst() override {
    if (--burst_depth_ == 0) spin_.reset();
  }

 private:
  static status copy(void* dst, const void* src, size_t n) {
    if (n > 0 && (dst == nullptr || src == nullptr))
      return {status_code::invalid_argument, "copy: null pointer"};
    if (n > 0) std::memmove(dst, src, n);
    return {};
  }

  device_capabilities caps_;
  thread_pool pool_;
  cpu_ops ops_;
  train::cpu_train_kernels train_;
  stream_id next_stream_ = 1;
  int burst_depth_ = 0;
  std::unique_ptr<thread_pool::spin_scope> spin_;
};

}  // namespace

result<std::unique_ptr<device>> make_cpu_device(const device_config& config) {
  int n = config.n_threads;
  if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Our pool splits BLAS calls itself; OpenBLAS's own threads would oversubscribe the cores.
  openblas_set_num_threads(1);
  // WEFT_CPU_MATMUL: a bad value, or amx / vnni where it cannot run, stops the device here, by
  // name.
  const auto kernel = quant_matmul_kernel_in_use();
  if (!kernel) return kernel.error();
  spdlog::debug("cpu device: {} threads, {} kernels, {} quantized matmuls, ggml {} numerics", n,
                quant_kernel_path(), quant_matmul_kernel_name(*kernel),
                ggml_simd_name(ggml_simd_layout()));
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::unique_ptr<device>(new cpu_device(n, std::max(n, cores)));
}

}  // namespace weft::gpu::cpu
