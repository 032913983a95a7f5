#pragma once
/// Matrix products of the CPU backend: y[t][r] = w[r] . x[t].
///
/// Quantized weights: activations quantized once per call (Q8_0 or Q8_1), then one quantized dot
/// product per (row, token) — the same function for every batch size, so a token's result does not
/// depend on what else is in the batch. F32 weights: OpenBLAS sgemm on a row slice per thread for
/// batches of >= 8 tokens, FMA dot products otherwise. F16 weights: activations rounded to fp16.

#include <cstdint>
#include <span>
#include <vector>

#include "gpu/cpu/thread_pool.hpp"
#include "gpu/status.hpp"
#include "gpu/tensor_view.hpp"

namespace weft::gpu::cpu {

/// Per-device scratch for activation conversions (grows, never shrinks).
struct matmul_scratch {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;     ///< activation block scales, block-major (quant_dot's act_scales)
  std::vector<float> f32_pairs;  ///< f32 / bf16 weights: the activations in pairs (f32_acts)
  std::vector<uint8_t> amx_tiles;  ///< the amx kernel's tile copy of the quants (amx_tile_acts)
};

/// The kernel Q4_0 / Q4_1 / Q8_0 weights are multiplied with, process-wide: `ggml` (llama.cpp's
/// x86 numerics, bit for bit), `amx` (Intel AMX tiles, amx_matmul.hpp: about twice the prompt
/// throughput on CPUs that have it, its own rounding — still batch-invariant) or `vnni` (the amx
/// kernel's packing and decode path on AVX-512 VNNI alone, prompts 16 tokens at a time: the amx
/// kernel's bits on CPUs without AMX) or `avx2` (the same packing and bits on AVX2, 8 rows a
/// register: CPUs without AVX-512 VNNI). Read once from WEFT_CPU_MATMUL (`auto` | `ggml` | `avx2`
/// | `vnni` | `amx`); `auto` (also unset) is amx where amx_available(), else vnni on Intel CPUs
/// where amx_vnni_available(), else avx2 where the CPU has no AVX-512 VNNI, else ggml. Child
/// processes inherit the variable.
enum class quant_matmul_kernel { ggml, amx, vnni, avx2 };
/// The kernel in use, or an error naming a bad WEFT_CPU_MATMUL value or why it cannot run here.
result<quant_matmul_kernel> quant_matmul_kernel_in_use();
/// Sets the kernel for the whole process (tests, benchmarks); `amx` / `vnni` / `avx2` fail where
/// they cannot run.
status set_quant_matmul_kernel(quant_matmul_kernel kernel);
const char* quant_matmul_kernel_name(quant_matmul_kernel kernel);

/// Bytes of w's copy in the layout the kernel in use reads fastest (amx / vnni / avx2: amx_pack;
/// the ggml kernel in AVX2 builds: groups of 4 rows, quant_dot.hpp pack4_rows), 0 when it reads `w`
/// as stored (other types and builds, or packing turned off). A copy is read by the kernel that was
/// in use when it was made.
size_t packed_weight_bytes(const tensor_view& w);
/// Whether packed_weight_bytes gives weights a copy at all: WEFT_CPU_PACK_WEIGHTS=0 keeps them as
/// stored (one copy of the matrices less in memory, slower matmuls; same results), read once.
bool pack_weights_enabled();
/// Sets it for the whole process (tests, benchmarks).
void set_pack_weights(bool enabled);
/// Writes that copy to dst on `pool`'s threads; set it as w.packed.
status pack_weight(thread_pool& pool, const tensor_view& w, void* dst);

/// Whether matmul supports weights of `type`.
bool matmul_supports(ggml_type type);

/// Computes y ([n_tokens][w.n_rows]) on `pool`. Blocks until done.
status matmul(thread_pool& pool, matmul_scratch& scratch, const tensor_view& w, const float* x,
              int64_t n_tokens, float* y);

/// Several weights sharing x: converts x once when their activation formats agree and runs all
/// rows in one parallel region. Results are bit-identical to separate `matmul` calls.
status matmul_multi(thread_pool& pool, matmul_scratch& scratch, std::span<const tensor_view> ws,
                    const float* x, int64_t n_tokens, std::span<float* const> ys);

/// Single-threaded reference: dequantizes activations the same way and sums in plain order
/// per block (used by tests to bound the error of the fast path, not to match it bit for bit).
void matmul_reference(const tensor_view& w, const float* x, int64_t n_tokens, float* y);

}  // namespace weft::gpu::cpu
