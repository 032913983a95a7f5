#pragma once
// Every `weft` subcommand registers itself on the CLI11 app through one of these functions.
// Each lives in its own <name>_cmd.cpp so that only the commands that need CAF include it.

#include <CLI/CLI.hpp>

#include <string>

namespace weft::apps {

/// Options shared by every subcommand (logging).
struct global_options {
  std::string log_level = "info";
};

/// `--weights-memory huge-pages|mmap` (gpu::gguf_memory) for the commands that load weights.
inline void add_weights_memory_option(CLI::App* cmd, std::string& value) {
  cmd->add_option("--weights-memory", value,
                  "Where the weights live: huge-pages (a private copy in 2 MiB pages, faster CPU "
                  "decode) or mmap (the file mapped, shared through the page cache)")
      ->capture_default_str()
      ->check(CLI::IsMember({"huge-pages", "mmap"}));
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
