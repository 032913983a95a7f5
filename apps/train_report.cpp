#include "apps/train_report.hpp"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include <nlohmann/json.hpp>

namespace weft::apps {

namespace fs = std::filesystem;
using gpu::train::step_record;

namespace {

std::atomic<int> g_stop_signal{0};

void on_stop_signal(int sig) {
  g_stop_signal.store(sig);
}

}  // namespace

void catch_stop_signals() {
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
}

int stop_signal() {
  return g_stop_signal.load();
}

std::string format_duration(double s) {
  const auto t = static_cast<int64_t>(s);
  char buf[32];
  if (t >= 3600) {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(t / 3600),
                  static_cast<long long>(t / 60 % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(t / 60),
                  static_cast<long long>(t % 60));
  }
  return buf;
}

void train_metrics::update(const step_record& r, double tokens_per_s) {
  std::lock_guard lk(mu_);
  last_ = r;
  tokens_total_ += r.tokens;
  tokens_per_s_ = tokens_per_s;
}

void train_metrics::add_checkpoint() {
  std::lock_guard lk(mu_);
  ++checkpoints_;
}

void train_metrics::update_eval(const gpu::train::eval_record& e) {
  std::lock_guard lk(mu_);
  eval_ = e;
  has_eval_ = true;
}

void train_metrics::add_group_restart() {
  std::lock_guard lk(mu_);
  ++restarts_;
}

std::string train_metrics::text() const {
  std::lock_guard lk(mu_);
  std::string s;
  auto line = [&s](const char* name, const char* type, const char* help, double v) {
    s += std::string{"# HELP "} + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
         name + " " + std::to_string(v) + "\n";
  };
  line("weft_train_steps_total", "counter", "Optimizer updates done",
       static_cast<double>(last_.step));
  line("weft_train_tokens_total", "counter", "Tokens trained on by this run",
       static_cast<double>(tokens_total_));
  line("weft_train_checkpoints_total", "counter", "Checkpoints written",
       static_cast<double>(checkpoints_));
  line("weft_train_group_restarts_total", "counter",
       "Restarts of the trainer group from a checkpoint (--trainers > 1)",
       static_cast<double>(restarts_));
  line("weft_train_loss", "gauge", "Mean token loss of the last step", last_.loss);
  line("weft_train_learning_rate", "gauge", "Learning rate of the last step", last_.lr);
  line("weft_train_grad_norm", "gauge", "Gradient norm of the last step (before clipping)",
       last_.grad_norm);
  line("weft_train_tokens_per_second", "gauge", "Throughput of the last step", tokens_per_s_);
  if (has_eval_) {
    line("weft_train_eval_loss", "gauge", "Mean token loss on --eval-data at the last evaluation",
         eval_.loss);
    line("weft_train_eval_step", "gauge", "Updates done at the last evaluation",
         static_cast<double>(eval_.step));
  }
  return s;
}

metrics_server::~metrics_server() {
  if (thread_.joinable()) {
    http_.stop();
    thread_.join();
  }
}

void metrics_server::add_json(const std::string& path, std::function<std::string()> body) {
  json_.emplace_back(path, std::move(body));
}

bool metrics_server::start(int port) {
  http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(text_(), "text/plain; version=0.0.4");
  });
  for (const auto& [path, body] : json_) {
    http_.Get(path, [&body = body](const httplib::Request&, httplib::Response& res) {
      res.set_content(body(), "application/json");
    });
  }
  if (!http_.bind_to_port("127.0.0.1", port)) return false;
  thread_ = std::thread([this] { http_.listen_after_bind(); });
  return true;
}

step_reporter::step_reporter(fs::path metrics_path, int64_t total_steps)
    : path_(std::move(metrics_path)), total_(total_steps) {
  if (path_.has_parent_path()) fs::create_directories(path_.parent_path());
  out_.open(path_, std::ios::trunc);
}

void step_reporter::start_at(int64_t first, const std::vector<step_record>& before) {
  first_ = first;
  tokens_since_start_ = 0;
  t_start_ = std::chrono::steady_clock::now();
  const bool rewind = !records_.empty();
  // Steps this reporter already shows keep their measured throughput.
  std::vector<shown> kept;
  for (const auto& r : before) {
    if (r.step > first) break;
    shown s{r, 0.0, -1.0};
    for (const auto& old : records_) {
      if (old.r.step == r.step) s = old;
    }
    kept.push_back(s);
  }
  records_ = std::move(kept);
  // Evaluations from `first` on are made again by the run that continues there.
  std::erase_if(evals_, [first](const gpu::train::eval_record& e) { return e.step >= first; });
  if (rewind) {
    rewrite();
  } else {
    for (const auto& s : records_) append(s);
  }
}

void step_reporter::append(const shown& s) {
  nlohmann::json j{{"step", s.r.step},     {"loss", s.r.loss},
                   {"lr", s.r.lr},         {"grad_norm", s.r.grad_norm},
                   {"tokens", s.r.tokens}, {"tokens_per_s", s.tokens_per_s}};
  if (s.reduce_seconds >= 0) j["allreduce_s"] = s.reduce_seconds;
  out_ << j.dump() << "\n";
  out_.flush();
}

void step_reporter::rewrite() {
  out_.close();
  out_.open(path_, std::ios::trunc);
  // An evaluation follows the step it was made after (step 0's comes first).
  auto evals_at = [&](int64_t step) {
    for (const auto& e : evals_) {
      if (e.step == step) append(e);
    }
  };
  evals_at(0);
  for (const auto& s : records_) {
    append(s);
    evals_at(s.r.step);
  }
}

double step_reporter::seconds_since_start() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start_).count();
}

void step_reporter::report(const step_record& r, double seconds, double reduce_seconds) {
  tokens_since_start_ += r.tokens;
  const double tps = static_cast<double>(r.tokens) / std::max(seconds, 1e-9);
  const double elapsed = seconds_since_start();
  const double eta = elapsed / static_cast<double>(std::max<int64_t>(1, r.step - first_)) *
                     static_cast<double>(total_ - r.step);
  char comm[48] = "";
  if (reduce_seconds >= 0) std::snprintf(comm, sizeof comm, "  all-reduce %.2fs", reduce_seconds);
  std::fprintf(stderr, "step %lld/%lld  loss %.4f  lr %.2e  |g| %.3f  %.0f tok/s%s  eta %s\n",
               static_cast<long long>(r.step), static_cast<long long>(total_), r.loss, r.lr,
               r.grad_norm, tps, comm, format_duration(eta).c_str());
  records_.push_back({r, tps, reduce_seconds});
  append(records_.back());
  prom_.update(r, tps);
}

void step_reporter::report_eval(const gpu::train::eval_record& e) {
  spdlog::info(
      "eval at step {}: loss {:.4f} (perplexity {:.3f}) over {} tokens of {} examples, "
      "{:.1f}s",
      e.step, e.loss, std::exp(e.loss), e.tokens, e.examples, e.seconds);
  evals_.push_back(e);
  append(e);
  prom_.update_eval(e);
}

void step_reporter::append(const gpu::train::eval_record& e) {
  nlohmann::json j{{"kind", "eval"},          {"step", e.step},
                   {"eval_loss", e.loss},     {"eval_ppl", std::exp(e.loss)},
                   {"eval_tokens", e.tokens}, {"eval_examples", e.examples},
                   {"seconds", e.seconds}};
  out_ << j.dump() << "\n";
  out_.flush();
}

fs::path metrics_path_of(const std::string& metrics, const std::string& ckpt_dir) {
  if (!metrics.empty()) return metrics;
  return ckpt_dir.empty() ? fs::path{"train-metrics.jsonl"} : fs::path{ckpt_dir} / "metrics.jsonl";
}

std::vector<step_record> read_metrics_file(const fs::path& path) {
  std::vector<step_record> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || j.contains("kind")) continue;  // eval lines
    step_record r;
    r.step = j.value("step", int64_t{0});
    r.loss = j.value("loss", 0.0);
    r.lr = j.value("lr", 0.0);
    r.grad_norm = j.value("grad_norm", 0.0);
    r.tokens = j.value("tokens", int64_t{0});
    if (r.step > 0) out.push_back(r);
  }
  return out;
}

namespace {

/// $WEFT_PLOT_TRAIN (plot_train.py), $WEFT_SCRIPTS/name, scripts/name above the binary (the
/// source tree), or share/weft/scripts/name of an installed weft (cmake/install.cmake).
std::optional<fs::path> find_script(const std::string& name) {
  if (name == "plot_train.py") {
    if (const char* p = std::getenv("WEFT_PLOT_TRAIN"); p != nullptr) return fs::path{p};
  }
  if (const char* d = std::getenv("WEFT_SCRIPTS"); d != nullptr) return fs::path{d} / name;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.root_path();
       dir = dir.parent_path()) {
    if (fs::exists(dir / "scripts" / name)) return dir / "scripts" / name;
  }
  const fs::path installed = exe.parent_path().parent_path() / "share/weft/scripts" / name;
  if (fs::exists(installed)) return installed;
  return std::nullopt;
}

}  // namespace

bool run_plot_script(const std::string& name, const fs::path& metrics, const std::string& png) {
  const auto script = find_script(name);
  if (!script) {
    spdlog::error("--plot: scripts/{} not found (set WEFT_SCRIPTS to the scripts folder)", name);
    return false;
  }
  const std::string cmd =
      "python3 '" + script->string() + "' '" + metrics.string() + "' '" + png + "'";
  if (std::system(cmd.c_str()) != 0) {
    spdlog::error("--plot: {} failed (it needs matplotlib)", script->string());
    return false;
  }
  spdlog::info("plot {}", png);
  return true;
}

bool plot_training(const fs::path& metrics, const std::string& png) {
  return run_plot_script("plot_train.py", metrics, png);
}

}  // namespace weft::apps
