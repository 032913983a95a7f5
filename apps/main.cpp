// The `weft` binary: one entry point, one subcommand per role (node, cluster, serve, generate,
// ...).

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>

#include "apps/commands.hpp"
#include "apps/process_control.hpp"
#include "apps/version.hpp"
#include "gpu/cpu/blas_kernels.hpp"

int main(int argc, char** argv) {
  weft::gpu::cpu::select_blas_kernels(argv);  // before anything else: it may re-execute
  weft::apps::exit_with_parent_if_asked();
  // Logs go to stderr: stdout carries command output (tokens, JSON, ready lines for scripts).
  spdlog::set_default_logger(spdlog::stderr_color_mt("weft"));
  CLI::App app{"weft — an actor runtime for serving and RL-training LLMs"};
  app.require_subcommand(1);
  app.fallthrough();  // global options (--log-level) may also follow the subcommand
  app.set_version_flag("--version", std::string{"weft "} + weft::apps::version_string());
  weft::apps::global_options globals;
  app.add_option("--log-level", globals.log_level,
                 "trace, debug, info, warn, error, off (or WEFT_LOG_LEVEL)")
      ->envname("WEFT_LOG_LEVEL");
  app.parse_complete_callback(
      [&] { spdlog::set_level(spdlog::level::from_str(globals.log_level)); });

  weft::apps::add_node_command(app, globals);
  weft::apps::add_cluster_command(app, globals);
  weft::apps::add_generate_command(app, globals);
  weft::apps::add_serve_command(app, globals);
  weft::apps::add_bench_command(app, globals);
  weft::apps::add_train_command(app, globals);
  weft::apps::add_rl_command(app, globals);
  weft::apps::add_chaos_command(app, globals);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return EXIT_SUCCESS;
}
