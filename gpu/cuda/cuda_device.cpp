#include "gpu/cuda/cuda_device.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "gpu/cuda/attention.cuh"
#include "gpu/cuda/elementwise.cuh"
#include "gpu/cuda/get_rows.cuh"
#include "gpu/cuda/matmul.cuh"
#include "gpu/cuda/rms_norm.cuh"
#include "gpu/cuda/rope.cuh"
#include "gpu/cuda/rows.cuh"
#include "gpu/cuda/runtime.cuh"
#include "gpu/cuda/train_ops.cuh"
#include "gpu/train/train_kernels.hpp"

namespace weft::gpu::cuda {

namespace {

status check(int code, const char* what) {
  if (code == 0) return {};
  return {status_code::internal,
          std::string{what} + ": " +
              (code >= 1000 ? "cuBLAS error " + std::to_string(code - 1000) : error_string(code))};
}

class cuda_ops final : public compute_ops {
 public:
  cuda_ops(stream_handle s, blas_handle blas) : s_(s), blas_(blas) {}
  ~cuda_ops() override {
    if (scratch_ != nullptr) free_memory(scratch_);
  }

  status matmul(const tensor_view& w, const float* x, int64_t n_tokens, float* y) override {
    const int type = static_cast<int>(w.type);
    if (type != 0 && type != 1 && type != 2 && type != 3 && type != 8) {
      return {status_code::unsupported,
              std::string{"cuda matmul: weight type "} + std::string{type_name(w.type)}};
    }
    const size_t need = matmul_scratch_bytes(type, w.n_cols, n_tokens);
    if (need > scratch_bytes_) {
      if (scratch_ != nullptr) free_memory(scratch_);
      scratch_ = nullptr;
      scratch_bytes_ = 0;
      if (auto st = check(malloc_zeroed(&scratch_, need), "cuda scratch"); !st) return st;
      scratch_bytes_ = need;
    }
    matmul_args a;
    a.type = type;
    a.w = w.data;
    a.row_bytes = w.row_bytes;
    a.n_rows = w.n_rows;
    a.n_cols = w.n_cols;
    a.x = x;
    a.n_tokens = n_tokens;
    a.y = y;
    a.scratch = scratch_;
    return check(launch_matmul(a, blas_, s_), "cuda matmul");
  }
  status rms_norm(const float* x, const float* weight, float* y, int64_t n_tokens, int64_t dim,
                  float eps) override {
    return check(launch_rms_norm(x, weight, y, n_tokens, dim, eps, s_), "cuda rms_norm");
  }
  status rope(float* x, const int32_t* positions, int64_t n_tokens, int64_t n_heads,
              int64_t head_dim, const rope_config& c) override {
    rope_args a;
    a.x = x;
    a.positions = positions;
    a.n_tokens = n_tokens;
    a.n_heads = n_heads;
    a.head_dim = head_dim;
    a.n_dims = c.n_dims;
    a.style = c.style == rope_style::normal ? 0 : 1;
    a.freq_base = c.freq_base;
    a.freq_scale = c.freq_scale;
    a.freq_factors = c.freq_factors;
    return check(launch_rope(a, s_), "cuda rope");
  }
  status swiglu(const float* gate, const float* up, float* y, int64_t n) override {
    return check(launch_swiglu(gate, up, y, n, s_), "cuda swiglu");
  }
  status add(const float* a, const float* b, float* y, int64_t n) override {
    return check(launch_add(a, b, y, n, s_), "cuda add");
  }
  status get_rows(const tensor_view& t, const int32_t* ids, int64_t n, float* y) override {
    return check(
        launch_get_rows(static_cast<int>(t.type), t.data, t.row_bytes, t.n_cols, ids, n, y, s_),
        "cuda get_rows");
  }
  status kv_store(const kv_store_batch& b) override {
    return check(
        launch_kv_store(b.k, b.v, b.k_cache, b.v_cache, b.slots, b.n_tokens, b.row_elems, s_),
        "cuda kv_store");
  }
  status attention(const attention_batch& b) override {
    attention_args a;
    a.q = b.q;
    a.out = b.out;
    a.k_cache = b.k_cache;
    a.v_cache = b.v_cache;
    a.token_seq = b.token_seq;
    a.token_pos = b.token_pos;
    a.block_table = b.block_table;
    a.seq_block_offset = b.seq_block_offset;
    a.n_tokens = b.n_tokens;
    a.n_heads = b.n_heads;
    a.n_kv_heads = b.n_kv_heads;
    a.head_dim = b.head_dim;
    a.block_size = b.block_size;
    a.max_positions = b.max_positions;
    a.scale = b.scale;
    return check(launch_attention(a, s_), "cuda attention");
  }
  status softmax(float* x, int64_t n_rows, int64_t n) override {
    return check(launch_softmax(x, n_rows, n, s_), "cuda softmax");
  }
  status gather_rows(const float* src, const int32_t* ids, int64_t n, int64_t dim,
                     float* dst) override {
    return check(launch_gather_rows(src, ids, n, dim, dst, s_), "cuda gather_rows");
  }
  status scatter_rows(const float* src, const int32_t* ids, int64_t n, int64_t dim,
                      float* dst) override {
    return check(launch_scatter_rows(src, ids, n, dim, dst, s_), "cuda scatter_rows");
  }
  status weighted_sum(const float* rows, const float* weights, int64_t n_tokens, int64_t k,
                      int64_t dim, float* out) override {
    return check(launch_weighted_sum(rows, weights, n_tokens, k, dim, out, s_),
                 "cuda weighted_sum");
  }

 private:
  stream_handle s_;
  blas_handle blas_;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

/// The trainer's ops on the compute stream (gpu/cuda/train_ops.cu).
class cuda_train_kernels final : public train::train_kernels {
 public:
  cuda_train_kernels(stream_handle s, blas_handle blas) : s_(s), blas_(blas) {}
  ~cuda_train_kernels() override {
    if (scratch_ != nullptr) free_memory(scratch_);
    if (partial_ != nullptr) free_memory(partial_);
  }
  cuda_train_kernels(const cuda_train_kernels&) = delete;
  cuda_train_kernels& operator=(const cuda_train_kernels&) = delete;

  status linear_forward(const float* x, const float* w, int64_t n, int64_t in, int64_t out,
                        float* y) override {
    return check(launch_linear_forward(x, w, n, in, out, y, blas_), "cuda linear_forward");
  }
  status linear_backward(const float* x, const float* w, const float* dy, int64_t n, int64_t in,
                         int64_t out, float* dx, float* dw, bool add_dx) override {
    return check(launch_linear_backward(x, w, dy, n, in, out, dx, dw, add_dx, blas_),
                 "cuda linear_backward");
  }
  status rms_norm_forward(const float* x, const float* g, int64_t n, int64_t d, float eps, float* y,
                          float* rstd) override {
    return check(launch_rms_norm_forward(x, g, n, d, eps, y, rstd, s_), "cuda rms_norm_forward");
  }
  status rms_norm_backward(const float* x, const float* g, const float* rstd, const float* dy,
                           int64_t n, int64_t d, float* dx, float* dg) override {
    return check(launch_rms_norm_backward(x, g, rstd, dy, n, d, dx, dg, s_),
                 "cuda rms_norm_backward");
  }
  status rope_apply(float* x, int64_t n, int64_t heads, int64_t head_dim, const double* cos,
                    const double* sin, int64_t n_dims, rope_style style, bool inverse) override {
    if (n_dims <= 0 || n_dims > head_dim || n_dims % 2 != 0)
      return {status_code::invalid_argument, "rope: n_dims " + std::to_string(n_dims)};
    return check(launch_train_rope(x, n, heads, head_dim, cos, sin, n_dims,
                                   style == rope_style::normal ? 0 : 1, inverse, s_),
                 "cuda rope");
  }
  status attention_forward(const float* q, const float* k, const float* v,
                           const train::device_sequences& seqs, const train::attention_shape& shape,
                           float* out, float* lse) override {
    train_attention_args a;
    if (auto st = args(q, k, v, seqs, shape, a); !st) return st;
    return check(launch_train_attention_forward(a, out, lse, nullptr, s_),
                 "cuda attention_forward");
  }
  status attention_backward(const float* q, const float* k, const float* v, const float* out,
                            const float* lse, const float* dout,
                            const train::device_sequences& seqs,
                            const train::attention_shape& shape, float* dq, float* dk,
                            float* dv) override {
    train_attention_args a;
    if (auto st = args(q, k, v, seqs, shape, a); !st) return st;
    a.out = out;
    a.lse = lse;
    a.dout = dout;
    const size_t need = static_cast<size_t>(seqs.n_tokens * shape.n_heads) * sizeof(float);
    if (need > scratch_bytes_) {
      if (scratch_ != nullptr) free_memory(scratch_);
      scratch_ = nullptr;
      scratch_bytes_ = 0;
      if (const int e = malloc_zeroed(&scratch_, need); e != 0)
        return {status_code::out_of_memory, "cuda attention_backward scratch: " + error_string(e)};
      scratch_bytes_ = need;
    }
    return check(launch_train_attention_backward(a, dq, dk, dv, static_cast<float*>(scratch_), s_),
                 "cuda attention_backward");
  }
  status swiglu_forward(const float* gate, const float* up, int64_t n, float* h) override {
    return check(launch_swiglu_forward(gate, up, n, h, s_), "cuda swiglu_forward");
  }
  status swiglu_backward(const float* gate, const float* up, const float* dh, int64_t n,
                         float* dgate, float* dup) override {
    return check(launch_swiglu_backward(gate, up, dh, n, dgate, dup, s_), "cuda swiglu_backward");
  }
  /// An out-of-range target (not checked on the host: targets are device memory) gives NaN.
  status cross_entropy(const float* logits, const int32_t* targets, int64_t n, int64_t vocab,
                       float grad_scale, float* dlogits, double* logp) override {
    return check(launch_cross_entropy(logits, targets, n, vocab, grad_scale, dlogits, logp, s_),
                 "cuda cross_entropy");
  }
  status fill(float* x, int64_t n, float value) override {
    return check(launch_fill(x, n, value, s_), "cuda fill");
  }
  status embedding_backward(const float* dx, const int32_t* tokens, int64_t n, int64_t d,
                            float* dembd) override {
    return check(launch_embedding_backward(dx, tokens, n, d, dembd, s_), "cuda embedding_backward");
  }
  status scale_rows(float* x, const float* scales, int64_t rows, int64_t width) override {
    return check(launch_scale_rows(x, scales, rows, width, s_), "cuda scale_rows");
  }
  status moe_combine(const float* exp_out, const int32_t* slot_row, const float* weights, int64_t n,
                     int64_t k, int64_t d, float* y) override {
    return check(launch_moe_combine(exp_out, slot_row, weights, n, k, d, y, s_),
                 "cuda moe_combine");
  }
  status moe_combine_backward(const float* dy, const float* exp_out, const int32_t* row_token,
                              const int32_t* row_slot, const float* weights, int64_t rows,
                              int64_t d, float* dout, float* dweights) override {
    return check(launch_moe_combine_backward(dy, exp_out, row_token, row_slot, weights, rows, d,
                                             dout, dweights, s_),
                 "cuda moe_combine_backward");
  }
  status scale(float* x, int64_t n, float factor) override {
    return check(launch_scale(x, n, factor, s_), "cuda scale");
  }
  status sum_squares(const float* x, int64_t n, double* acc) override {
    if (partial_ == nullptr) {
      if (const int e = malloc_zeroed(&partial_, kSumSquaresBlocks * sizeof(double)); e != 0)
        return {status_code::out_of_memory, "cuda sum_squares scratch: " + error_string(e)};
    }
    return check(launch_sum_squares(x, n, acc, static_cast<double*>(partial_), s_),
                 "cuda sum_squares");
  }
  status adamw_update(float* p, const float* g, float* m, float* v, int64_t n, bool decay,
                      const train::adamw_scalars& s) override {
    const adamw_args a{s.step_size, s.sqrt_bc2, s.eps,        s.keep,
                       s.beta1,     s.beta2,    s.grad_scale, s.clip};
    return check(launch_adamw(p, g, m, v, n, decay, a, s_), "cuda adamw");
  }

 private:
  static status args(const float* q, const float* k, const float* v,
                     const train::device_sequences& seqs, const train::attention_shape& shape,
                     train_attention_args& a) {
    if (shape.n_heads <= 0 || shape.n_kv_heads <= 0 || shape.n_heads % shape.n_kv_heads != 0 ||
        shape.head_dim <= 0 || shape.head_dim > 256)
      return {status_code::invalid_argument, "cuda attention: heads " +
                                                 std::to_string(shape.n_heads) + " / kv heads " +
                                                 std::to_string(shape.n_kv_heads) + " / head_dim " +
                                                 std::to_string(shape.head_dim) + " (at most 256)"};
    a.q = q;
    a.k = k;
    a.v = v;
    a.starts = seqs.starts;
    a.prefix = seqs.prefix;
    a.n_seqs = seqs.n_seqs;
    a.n_tokens = seqs.n_tokens;
    a.n_heads = shape.n_heads;
    a.n_kv_heads = shape.n_kv_heads;
    a.head_dim = shape.head_dim;
    a.scale = static_cast<float>(shape.scale);
    return {};
  }

  stream_handle s_;
  blas_handle blas_;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  void* partial_ = nullptr;  ///< kSumSquaresBlocks doubles (sum_squares).
};

class cuda_device final : public device {
 public:
  cuda_device(int index, stream_handle compute, blas_handle blas)
      : ops_(compute, blas), train_(compute, blas), blas_(blas) {
    streams_.push_back(compute);
    caps_.kind = device_kind::cuda;
    caps_.name = "cuda:" + std::to_string(index) + " (" + device_name(index) + ")";
    caps_.total_memory_bytes = device_memory_bytes(index);
    caps_.memory = memory_visibility::device_only;
    caps_.weight_types = {ggml_type::f32, ggml_type::f16, ggml_type::q8_0, ggml_type::q4_0,
                          ggml_type::q4_1};
  }
  ~cuda_device() override {
    blas_destroy(blas_);
    for (auto s : streams_) stream_destroy(s);
  }

  const device_capabilities& capabilities() const override { return caps_; }
  result<device_buffer> allocate(size_t size_bytes) override {
    void* p = nullptr;
    if (const int e = malloc_zeroed(&p, std::max<size_t>(size_bytes, 1)); e != 0) {
      return status{status_code::out_of_memory,
                    "cudaMalloc(" + std::to_string(size_bytes) + "): " + error_string(e)};
    }
    return device_buffer{p, size_bytes};
  }
  void release(device_buffer b) override {
    if (b.data != nullptr) free_memory(b.data);
  }
  result<stream_id> create_stream() override {
    stream_handle s = nullptr;
    if (auto st = check(stream_create(&s), "cudaStreamCreate"); !st) return st;
    streams_.push_back(s);
    return static_cast<stream_id>(streams_.size() - 1);
  }
  status synchronize(stream_id s) override {
    if (s < 0 || static_cast<size_t>(s) >= streams_.size())
      return {status_code::invalid_argument, "bad stream"};
    return check(stream_synchronize(streams_[static_cast<size_t>(s)]), "cudaStreamSynchronize");
  }
  status copy_to_device(void* dst, const void* src, size_t n, stream_id s) override {
    return copy(dst, src, n, 0, s);
  }
  status copy_to_host(void* dst, const void* src, size_t n, stream_id s) override {
    return copy(dst, src, n, 1, s);
  }
  status copy_on_device(void* dst, const void* src, size_t n, stream_id s) override {
    return copy(dst, src, n, 2, s);
  }
  compute_ops& ops() override { return ops_; }
  train::train_kernels* training() override { return &train_; }

 private:
  status copy(void* dst, const void* src, size_t n, int kind, stream_id s) {
    if (s < 0 || static_cast<size_t>(s) >= streams_.size())
      return {status_code::invalid_argument, "bad stream"};
    if (n == 0) return {};
    return check(memcpy_async(dst, src, n, kind, streams_[static_cast<size_t>(s)]),
                 "cudaMemcpyAsync");
  }

  device_capabilities caps_;
  cuda_ops ops_;
  cuda_train_kernels train_;
  blas_handle blas_;
  std::vector<stream_handle> streams_;
};

}  // namespace

int cuda_device_count() {
  return std::max(0, device_count());
}

result<std::unique_ptr<device>> make_cuda_device(const device_config& config) {
  const int n = device_count();
  if (n <= 0) {
    return status{status_code::unsupported,
                  n == 0 ? std::string{"no CUDA device present"}
                         : "no usable CUDA device (cudaGetDeviceCount: " + error_string(-n) + ")"};
  }
  if (config.device_index < 0 || config.device_index >= n) {
    return status{status_code::invalid_argument,
                  "CUDA device index " + std::to_string(config.device_index) + " out of range (" +
                      std::to_string(n) + " devices)"};
  }
  if (auto st = check(set_device(config.device_index), "cudaSetDevice"); !st) return st;
  stream_handle s = nullptr;
  if (auto st = check(stream_create(&s), "cudaStreamCreate"); !st) return st;
  blas_handle blas = nullptr;
  if (auto st = check(blas_create(&blas, s), "cublasCreate"); !st) {
    stream_destroy(s);
    return st;
  }
  spdlog::info("cuda device {}: {}", config.device_index, device_name(config.device_index));
  return std::unique_ptr<device>(new cuda_device(config.device_index, s, blas));
}

}  // namespace weft::gpu::cuda
