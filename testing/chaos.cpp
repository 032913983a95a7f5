#include "testing/chaos.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "testing/local_cluster.hpp"

namespace weft::testing {

serve_process::serve_process(const std::vector<std::string>& args, std::string weft_binary,
                             int ready_timeout_s) {
  if (weft_binary.empty()) weft_binary = default_weft_binary();
  std::vector<std::string> argv = {weft_binary, "serve", "--port", "0"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto c = actors::child_process::start(argv);
  if (!c) {
    throw std::runtime_error("cannot start " + weft_binary + " serve: " + c.error().to_string() +
                             " (set WEFT_BINARY to the weft executable)");
  }
  proc_ = std::make_unique<actors::child_process>(std::move(*c));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(ready_timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    auto line = proc_->read_line(1000);
    if (!line) {
      if (proc_->exited()) throw std::runtime_error("weft serve exited before it was ready");
      continue;
    }
    const std::string tag = "weft-serve-ready url=";
    if (line->rfind(tag, 0) == 0) {
      url_ = line->substr(tag.size(), line->find(' ', tag.size()) - tag.size());
      return;
    }
  }
  proc_->stop(2000);
  throw std::runtime_error("weft serve was not ready within " + std::to_string(ready_timeout_s) +
                           " s");
}

serve_process::~serve_process() {
  if (proc_) proc_->stop(5000);
}

std::vector<std::string> chaos_report::broken() const {
  std::vector<std::string> out;
  if (!report.is_object() || !report.contains("invariants")) return out;
  for (const auto& [name, v] : report["invariants"].items()) {
    if (!v.value("ok", false)) out.push_back(name);
  }
  return out;
}

chaos_report run_chaos(const std::string& url, const std::vector<std::string>& args,
                       std::string weft_binary) {
  if (weft_binary.empty()) weft_binary = default_weft_binary();
  const auto dir = std::filesystem::temp_directory_path();
  const auto path = dir / ("weft-chaos-" + std::to_string(::getpid()) + "-" +
                           std::to_string(free_port()) + ".json");
  std::vector<std::string> argv = {weft_binary, "chaos", "--url", url};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"--report", path.string()});
  auto c = actors::child_process::start(argv);
  if (!c) {
    throw std::runtime_error("cannot start " + weft_binary + " chaos: " + c.error().to_string());
  }
  chaos_report r;
  int status = 0;
  for (;;) {
    auto line = c->read_line(500);
    if (line) {
      r.output += *line + "\n";
      continue;
    }
    if (c->exited(&status)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // stdout closed, still running
  }
  while (auto line = c->read_line(100)) r.output += *line + "\n";  // what is left in the pipe
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(path);
  if (in) r.report = nlohmann::json::parse(in, nullptr, false);
  if (r.report.is_discarded()) r.report = nullptr;
  std::error_code ec;
  std::filesystem::remove(path, ec);
  return r;
}

::testing::AssertionResult invariants_hold(const chaos_report& r) {
  const auto broken = r.broken();
  if (r.exit_code == 0 && broken.empty() && r.report.is_object()) {
    return ::testing::AssertionSuccess();
  }
  auto failure = ::testing::AssertionFailure();
  failure << "weft chaos exited " << r.exit_code;
  if (!r.report.is_object()) failure << " without a report";
  for (const auto& b : broken) failure << "; invariant " << b << " broken";
  return failure << "\n" << r.output;
}

void serve_chaos_test::SetUp() {
  server = std::make_unique<serve_process>(serve_args());
}

void serve_chaos_test::TearDown() {
  server.reset();
}

chaos_report serve_chaos_test::chaos(const std::vector<std::string>& args) {
  return run_chaos(server->url(), args);
}

}  // namespace weft::testing
