#pragma once
// Every `weft` subcommand registers itself on the CLI11 app through one of these functions.
// Each lives in its own <name>_cmd.cpp so that only the commands that need CAF include it.

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <string>

#include "gpu/cpu/amx_matmul.hpp"

namespace weft::apps {

/// Options shared by every subcommand (logging).
struct global_options {
  std::string log_level = "info";
};

/// Checks that a numeric option is > 0 (`positive_number`) or >= 0 (`non_negative_number`), with
/// a message that says so: CLI11 2.1's PositiveNumber and NonNegativeNumber print their range as
/// "0.000000 to 1797693...".
inline CLI::Validator sign_check(bool zero_allowed) {
  return CLI::Validator(
      [zero_allowed](std::string& v) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        if (end == v.c_str() || *end != '\0') return v + " is not a number";
        if (zero_allowed ? x >= 0 : x > 0) return {};
        return std::string{"must be "} + (zero_allowed ? ">= 0" : "> 0") + ", not " + v;
      },
      zero_allowed ? "NONNEGATIVE" : "POSITIVE");
}
inline const CLI::Validator positive_number = sign_check(false);
inline const CLI::Validator non_negative_number = sign_check(true);

/// `--weights-memory huge-pages|mmap` (gpu::gguf_memory) for the commands that load weights.
inline void add_weights_memory_option(CLI::App* cmd, std::string& value) {
  cmd->add_option("--weights-memory", value,
                  "Where the weights live: huge-pages (a private copy in 2 MiB pages, faster CPU "
                  "decode) or mmap (the file mapped, shared through the page cache)")
      ->capture_default_str()
      ->check(CLI::IsMember({"huge-pages", "mmap"}));
}

/// `--cpu-matmul auto|ggml|vnni|amx` (or WEFT_CPU_MATMUL) for the commands that run the CPU engine:
/// sets WEFT_CPU_MATMUL in this process's environment, which the CPU device reads and the worker
/// processes it starts inherit (gpu/cpu/matmul.hpp, docs/engine.md "AMX matmuls").
inline void add_cpu_matmul_option(CLI::App* cmd, std::string& value) {
  cmd->add_option("--cpu-matmul", value,
                  "Kernel for Q4_0/Q4_1/Q8_0 weights on the CPU: auto (amx where the CPU has "
                  "AMX-INT8, else vnni on Intel CPUs with AVX-512 VNNI, else avx2 on CPUs "
                  "without AVX-512 VNNI, else ggml), ggml "
                  "(llama.cpp's x86 numerics, bit for bit), amx (Intel AMX tiles: prompts about "
                  "twice as fast; its own rounding; an error where the CPU has no AMX) or vnni "
                  "(the amx kernel's rounding and decode path on AVX-512 VNNI alone; an error "
                  "where the CPU has no AVX-512 VNNI) or avx2 (the amx kernel's rounding on "
                  "AVX2, for CPUs without AVX-512 VNNI)")
      ->envname("WEFT_CPU_MATMUL")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "ggml", "avx2", "vnni", "amx"}))
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            if (v == "amx" && !gpu::cpu::amx_available())
              return std::string{"amx cannot run here: "} + gpu::cpu::amx_unavailable_reason();
            if (v == "vnni" && !gpu::cpu::amx_vnni_available())
              return std::string{"vnni cannot run here: "} +
                     gpu::cpu::amx_vnni_unavailable_reason();
            if (v == "avx2" && !gpu::cpu::amx_avx2_available())
              return "avx2 cannot run here: this build has no AVX2, FMA and F16C";
            return {};
          },
          ""))
      ->each([](const std::string& v) { ::setenv("WEFT_CPU_MATMUL", v.c_str(), 1); });
}

void add_node_command(CLI::App& app, const global_options& globals);
void add_cluster_command(CLI::App& app, const global_options& globals);
void add_generate_command(CLI::App& app, const global_options& globals);
void add_serve_command(CLI::App& app, const global_options& globals);
void add_bench_command(CLI::App& app, const global_options& globals);
void add_train_command(CLI::App& app, const global_options& globals);
void add_rl_command(CLI::App& app, const global_options& globals);
void add_chaos_command(CLI::App& app, const global_options& globals);

}  // namespace weft::apps

namespace weft::actors {
class role_registry;
}  // namespace weft::actors

namespace weft::apps {

/// Extra roles a `weft node` accepts beyond weft's own. The product binary registers none; the
/// test build (`weft_test`, tests/support) registers the test-only roles.
void add_extra_roles(actors::role_registry& roles);

}  // namespace weft::apps
