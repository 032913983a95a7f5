#include "apps/loadgen/report.hpp"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "apps/version.hpp"

namespace weft::apps::loadgen {

namespace fs = std::filesystem;

nlohmann::json machine_info() {
  std::string cpu = "unknown";
  std::ifstream in{"/proc/cpuinfo"};
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) cpu = line.substr(line.find_first_not_of(" \t", colon + 1));
      break;
    }
  }
  std::array<char, 256> host{};
  if (gethostname(host.data(), host.size() - 1) != 0) host[0] = '\0';
  return {{"nproc", std::thread::hardware_concurrency()},
          {"cpu_model", cpu},
          {"hostname", std::string{host.data()}}};
}

std::string git_commit() {
  // version_string() is "<version> (<short commit>)".
  const std::string v = version_string();
  const auto open = v.find('(');
  const auto close = v.rfind(')');
  return open != std::string::npos && close > open ? v.substr(open + 1, close - open - 1)
                                                   : "unknown";
}

std::string process_command_line() {
  std::ifstream in{"/proc/self/cmdline", std::ios::binary};
  std::string raw{std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
  while (!raw.empty() && raw.back() == '\0') raw.pop_back();
  for (char& c : raw) c = c == '\0' ? ' ' : c;
  return raw;
}

namespace {
std::string format_utc(const char* fmt) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::array<char, 64> buf{};
  std::strftime(buf.data(), buf.size(), fmt, &tm);
  return buf.data();
}

std::string dist_line(const distribution_summary& d, int precision) {
  return fmt::format("mean={:.{}f} p50={:.{}f} p90={:.{}f} p99={:.{}f} (n={})", d.mean, precision,
                     d.p50, precision, d.p90, precision, d.p99, precision, d.count);
}

std::string slo_text(const slo_config& slo) {
  std::string t;
  if (slo.ttft_ms > 0) t += fmt::format("ttft<={}ms", slo.ttft_ms);
  if (slo.tpot_ms > 0) t += fmt::format("{}tpot<={}ms", t.empty() ? "" : " and ", slo.tpot_ms);
  return t;
}
}  // namespace

std::string utc_date() {
  return format_utc("%Y-%m-%d");
}
std::string utc_timestamp() {
  return format_utc("%Y-%m-%dT%H:%M:%SZ");
}

std::vector<std::string> summary_lines(const std::string& label, double rate_rps,
                                       const run_summary& s, const slo_config& slo) {
  const std::string head = fmt::format("serve {} rate={:.3f}rps", label, rate_rps);
  std::vector<std::string> lines{
      fmt::format("{} ttft_ms {}", head, dist_line(s.ttft_ms, 1)),
      fmt::format("{} tpot_ms {}", head, dist_line(s.tpot_ms, 2)),
      fmt::format("{} itl_ms {}", head, dist_line(s.itl_ms, 2)),
      fmt::format("{} e2e_ms {}", head, dist_line(s.e2e_ms, 1)),
      fmt::format(
          "{} throughput output_tok_s={:.2f} req_s={:.3f} offered_req_s={:.3f} duration_s={:.1f}",
          head, s.output_throughput_tps, s.request_throughput_rps, s.offered_rate_rps,
          s.duration_s),
      s.prompt_tokens.count > 0
          ? fmt::format("{} prompt_tokens {}", head, dist_line(s.prompt_tokens, 1))
          : fmt::format("{} prompt_tokens not reported (no usage in the stream)", head),
      fmt::format("{} completion_tokens {}", head, dist_line(s.completion_tokens, 1)),
      s.cached_tokens.count > 0
          ? fmt::format("{} cached_tokens {} total={} of {} prompt tokens", head,
                        dist_line(s.cached_tokens, 1), s.total_cached_tokens, s.total_prompt_tokens)
          : fmt::format("{} cached_tokens not reported (no usage.prompt_tokens_details)", head),
      fmt::format("{} errors={} of {} (client_overload={})", head, s.n_failed, s.n_requests,
                  s.n_client_overload),
  };
  if (s.slo_attainment >= 0) {
    lines.push_back(
        fmt::format("{} slo_attainment={:.3f} ({})", head, s.slo_attainment, slo_text(slo)));
  }
  return lines;
}

std::string goodput_line(const std::string& label, const goodput_result& g,
                         const bisection_config& c, const slo_config& slo) {
  std::string where;
  switch (g.status) {
    case goodput_status::found:
      where = fmt::format("between {:.3f} and {:.3f} rps", g.goodput_rps, g.upper_bound_rps);
      break;
    case goodput_status::below_min:
      where = fmt::format("below --rate-min {:.3f} rps", c.rate_min_rps);
      break;
    case goodput_status::at_least_max:
      where = fmt::format("at least --rate-max {:.3f} rps (raise it)", c.rate_max_rps);
      break;
  }
  return fmt::format("serve {} goodput={:.3f}rps ({}; >= {:.0f}% of requests meet {}; {} probes)",
                     label, g.goodput_rps, where, c.attainment_target * 100, slo_text(slo),
                     g.probes.size());
}

result<bool> write_json_file(const std::string& path, const nlohmann::json& doc) {
  std::error_code ec;
  const fs::path p{path};
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  if (ec)
    return result<bool>::failure("cannot create directory " + p.parent_path().string() + ": " +
                                 ec.message());
  std::ofstream out{p};
  if (!out) return result<bool>::failure("cannot write " + path);
  out << doc.dump(1) << '\n';
  if (!out) return result<bool>::failure("error while writing " + path);
  return true;
}

result<std::string> find_plot_script(const std::string& explicit_path) {
  const fs::path rel = fs::path{"bench"} / "e2e" / "plot_serve.py";
  if (!explicit_path.empty()) {
    if (fs::exists(explicit_path)) return explicit_path;
    return result<std::string>::failure("plot script " + explicit_path + " does not exist");
  }
  std::error_code ec;
  fs::path dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  for (int i = 0; !ec && i < 6 && !dir.empty(); ++i, dir = dir.parent_path()) {
    if (fs::exists(dir / rel)) return (dir / rel).string();
    if (dir == dir.parent_path()) break;
  }
  if (fs::exists(fs::current_path(ec) / rel)) return (fs::current_path(ec) / rel).string();
  return result<std::string>::failure(
      "cannot find bench/e2e/plot_serve.py beside the weft binary or under the current "
      "directory; pass --plot-script");
}

result<bool> run_plot(const std::string& script, const std::vector<std::string>& json_paths,
                      const std::string& png_path) {
  std::vector<std::string> args{"python3", script};
  args.insert(args.end(), json_paths.begin(), json_paths.end());
  args.push_back("-o");
  args.push_back(png_path);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return result<bool>::failure("cannot fork to run the plot script");
  if (pid == 0) {
    execvp("python3", argv.data());
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0)
    return result<bool>::failure("waiting for the plot script failed");
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
    return result<bool>::failure("python3 is not installed (no plot)");
  if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
    return result<bool>::failure(
        "matplotlib is missing: install it (apt-get install python3-matplotlib, or pip install "
        "matplotlib) and rerun: python3 " +
        script + " <json> -o " + png_path);
  }
  return result<bool>::failure("the plot script failed (exit status " +
                               std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                               "); see its message above");
}

}  // namespace weft::apps::loadgen
