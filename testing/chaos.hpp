#pragma once
/// weft::testing's chaos half (docs/chaos.md, "In your own tests"): a `weft serve` child process
/// for a test, `weft chaos` run against it (the same engine as the command: faults on a schedule
/// under load, invariants, report), and a GoogleTest fixture that puts the two together.
///
///   class my_chaos : public weft::testing::serve_chaos_test {
///     std::vector<std::string> serve_args() const override { return {"--workers", "2"}; }
///   };
///   TEST_F(my_chaos, survives_a_killed_worker) {
///     auto r = chaos({"--duration", "15", "--fault", "kill:any@5"});
///     EXPECT_TRUE(weft::testing::invariants_hold(r));
///   }

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "actors/child_process.hpp"

namespace weft::testing {

/// `weft serve --port 0 ARGS` as a child process; the constructor returns once it printed its
/// ready line (throws std::runtime_error if it exits or does not get ready in time). The
/// destructor stops it (SIGTERM, then SIGKILL).
class serve_process {
 public:
  explicit serve_process(const std::vector<std::string>& args, std::string weft_binary = {},
                         int ready_timeout_s = 240);
  ~serve_process();
  serve_process(const serve_process&) = delete;
  serve_process& operator=(const serve_process&) = delete;

  /// "http://127.0.0.1:PORT".
  const std::string& url() const { return url_; }
  actors::child_process& process() { return *proc_; }

 private:
  std::unique_ptr<actors::child_process> proc_;
  std::string url_;
};

/// What one `weft chaos` run found.
struct chaos_report {
  int exit_code = -1;     ///< 0: every invariant held; 1: one broke; 2: bad options
  std::string output;     ///< its summary (stdout)
  nlohmann::json report;  ///< the JSON report (docs/chaos.md, "The report"); null if none
  /// Names of the invariants that broke (empty when all held).
  std::vector<std::string> broken() const;
};

/// Runs `weft chaos --url URL ARGS --report <temporary file>` and returns its outcome. Throws
/// std::runtime_error when the command cannot be started.
chaos_report run_chaos(const std::string& url, const std::vector<std::string>& args,
                       std::string weft_binary = {});

/// For EXPECT_TRUE / ASSERT_TRUE: success when the run exited 0 with every invariant held;
/// otherwise the broken invariants and the summary.
::testing::AssertionResult invariants_hold(const chaos_report& r);

/// A GoogleTest fixture: a fresh `weft serve` (serve_args()) for every test, and chaos() to run
/// `weft chaos` against it.
class serve_chaos_test : public ::testing::Test {
 protected:
  /// Arguments of `weft serve` (default: two colocated workers on the default model).
  virtual std::vector<std::string> serve_args() const { return {"--workers", "2"}; }
  void SetUp() override;
  void TearDown() override;
  chaos_report chaos(const std::vector<std::string>& args);

  std::unique_ptr<serve_process> server;
};

}  // namespace weft::testing
