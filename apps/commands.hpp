#pragma once
// Every `weft` subcommand registers itself on the CLI11 app through one of these functions.
// Each lives in its own <name>_cmd.cpp so that only the commands that need CAF include it.

#include <CLI/CLI.hpp>

namespace weft::apps {

/// Options shared by every subcommand (logging).
struct global_options {
  std::string log_level = "info";
};

void add_node_command(CLI::App& app, const global_options& globals);
void add_cluster_command(CLI::App& app, const global_options& globals);
void add_generate_command(CLI::App& app, const global_options& globals);
void add_serve_command(CLI::App& app, const global_options& globals);
void add_bench_command(CLI::App& app, const global_options& globals);

}  // namespace weft::apps
