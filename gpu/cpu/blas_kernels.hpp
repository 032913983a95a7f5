#pragma once
/// OpenBLAS picks its kernels once, when the library loads, from the CPU's model number. The
/// OpenBLAS of Debian 12 (0.3.21) does not know recent CPUs — e.g. Intel family 6 model 207
/// (Emerald Rapids) — and falls back to its "Prescott" kernels: SSE3, no AVX. On such a host SGEMM
/// runs 5-7x below what the same library does with its AVX-512 kernels (measured: 38 against
/// 213-279 GFLOP/s on 2 threads), and every f32 GEMM of training and of f32 rollout engines with
/// it.
///
/// select_blas_kernels() fixes that for a program's whole process tree: when OpenBLAS fell back to
/// Prescott on a CPU with AVX2 or AVX-512, it sets OPENBLAS_CORETYPE to the newest kernel family
/// the CPU's instruction sets support and executes the program again (same pid, same arguments);
/// child processes inherit the variable. Nothing happens when OPENBLAS_CORETYPE is already set
/// (the user's choice — or the second start), when OpenBLAS is not loaded, or when it chose
/// anything else. Header-only (libc only), so that every main() can call it first thing.
/// docs/engine.md, "BLAS kernels".

#include <dlfcn.h>
#include <strings.h>
#include <unistd.h>

#include <cstdlib>

namespace weft::gpu::cpu {

/// The OPENBLAS_CORETYPE that fits this CPU's instruction sets, or nullptr (nothing better than
/// OpenBLAS's own choice).
inline const char* blas_coretype_for_this_cpu() {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
  if (avx512 && __builtin_cpu_supports("avx512bf16")) return "COOPERLAKE";
  if (avx512) return "SKYLAKEX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "HASWELL";
  return nullptr;
}

/// The kernel family the loaded OpenBLAS uses ("Prescott", "Haswell", ...), or nullptr when no
/// OpenBLAS is loaded in this process.
inline const char* blas_corename() {
  using corename_fn = char* (*)();
  auto fn = reinterpret_cast<corename_fn>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  return fn != nullptr ? fn() : nullptr;
}

/// See the top of this file. Call first thing in main(); returns unless it re-executes.
inline void select_blas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const char* core = blas_corename();
  if (core == nullptr || ::strcasecmp(core, "Prescott") != 0) return;
  const char* want = blas_coretype_for_this_cpu();
  if (want == nullptr) return;
  ::setenv("OPENBLAS_CORETYPE", want, 1);
  ::execv("/proc/self/exe", argv);
  // The exec failed: carry on with OpenBLAS's own kernels.
}

}  // namespace weft::gpu::cpu
