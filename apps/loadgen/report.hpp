#pragma once
// Benchmark output: machine description, summary lines, the JSON file and the plot.

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "apps/loadgen/goodput.hpp"
#include "apps/loadgen/result.hpp"
#include "apps/loadgen/stats.hpp"

namespace weft::apps::loadgen {

/// {"nproc", "cpu_model", "hostname"} of this machine (from /proc/cpuinfo and the OS).
nlohmann::json machine_info();

/// The commit weft was built from ("unknown" outside a git checkout).
std::string git_commit();

/// This process's command line, arguments joined by spaces (from /proc/self/cmdline).
std::string process_command_line();

/// Today's UTC date as YYYY-MM-DD, and the current UTC time as ISO 8601.
std::string utc_date();
std::string utc_timestamp();

/// One line per figure of a run, "serve <label> rate=<r> <figure> ...".
std::vector<std::string> summary_lines(const std::string& label, double rate_rps,
                                       const run_summary& s, const slo_config& slo);

/// The line reporting a goodput search.
std::string goodput_line(const std::string& label, const goodput_result& g,
                         const bisection_config& c, const slo_config& slo);

/// Writes `doc` (indented) to `path`, creating parent directories.
result<bool> write_json_file(const std::string& path, const nlohmann::json& doc);

/// Finds bench/e2e/plot_serve.py: `explicit_path` if set, else beside the source tree of the
/// running binary (walking up from /proc/self/exe), else under the current directory.
result<std::string> find_plot_script(const std::string& explicit_path);

/// Runs `python3 <script> <jsons...> -o <png>`; the error says what failed (e.g. matplotlib
/// missing).
result<bool> run_plot(const std::string& script, const std::vector<std::string>& json_paths,
                      const std::string& png_path);

}  // namespace weft::apps::loadgen
