// `weft train`: supervised fine-tuning of a GGUF model on JSON-lines data in this process
// (docs/training.md): AdamW, warmup + cosine schedule, clipping, exact checkpoints, GGUF export.

#include <cblas.h>
#include <httplib.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "actors/serve/model_host.hpp"
#include "apps/commands.hpp"
#include "apps/config_file.hpp"
#include "gpu/chat_template.hpp"
#include "gpu/gguf.hpp"
#include "gpu/tokenizer.hpp"
#include "gpu/train/checkpoint.hpp"
#include "gpu/train/export.hpp"
#include "gpu/train/sft_data.hpp"
#include "gpu/train/sft_trainer.hpp"

namespace weft::apps {

namespace {

namespace fs = std::filesystem;
using namespace gpu::train;

struct train_options {
  std::string config_file;
  std::string model_path;
  std::string data_path;
  int64_t steps = 100;
  int64_t batch_tokens = 4096;
  int64_t micro_batch_tokens = 1024;
  int64_t max_seq_tokens = 1024;
  double lr = 5e-5;
  int64_t warmup_steps = 0;
  std::string lr_schedule = "cosine";
  double min_lr_ratio = 0.1;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, adam_eps = 1e-8;
  double max_grad_norm = 1.0;
  uint64_t seed = 0;
  int threads = 0;
  bool recompute = false;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 50;
  int keep_checkpoints = 2;
  bool resume = false;
  std::string save_path;
  std::string save_type = "f16";
  std::string metrics_path;
  int metrics_port = 0;
  std::string plot_path;
};

std::atomic<int> g_stop_signal{0};

void on_stop_signal(int sig) {
  g_stop_signal.store(sig);
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

/// Prometheus text of the run's state, served on --metrics-port.
class train_metrics {
 public:
  void update(const step_record& r, double tokens_per_s) {
    std::lock_guard lk(mu_);
    last_ = r;
    tokens_total_ += r.tokens;
    tokens_per_s_ = tokens_per_s;
  }
  void add_checkpoint() {
    std::lock_guard lk(mu_);
    ++checkpoints_;
  }
  std::string text() const {
    std::lock_guard lk(mu_);
    std::string s;
    auto line = [&s](const char* name, const char* type, const char* help, double v) {
      s += std::string{"# HELP "} + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
           name + " " + std::to_string(v) + "\n";
    };
    line("weft_train_steps_total", "counter", "Optimizer updates done",
         static_cast<double>(last_.step));
    line("weft_train_tokens_total", "counter", "Tokens trained on by this process",
         static_cast<double>(tokens_total_));
    line("weft_train_checkpoints_total", "counter", "Checkpoints written",
         static_cast<double>(checkpoints_));
    line("weft_train_loss", "gauge", "Mean token loss of the last step", last_.loss);
    line("weft_train_learning_rate", "gauge", "Learning rate of the last step", last_.lr);
    line("weft_train_grad_norm", "gauge", "Gradient norm of the last step (before clipping)",
         last_.grad_norm);
    line("weft_train_tokens_per_second", "gauge", "Throughput of the last step", tokens_per_s_);
    return s;
  }

 private:
  mutable std::mutex mu_;
  step_record last_;
  int64_t tokens_total_ = 0;
  int64_t checkpoints_ = 0;
  double tokens_per_s_ = 0.0;
};

void write_metrics_line(std::ofstream& out, const step_record& r, double tokens_per_s) {
  out << nlohmann::json{{"step", r.step},     {"loss", r.loss},
                        {"lr", r.lr},         {"grad_norm", r.grad_norm},
                        {"tokens", r.tokens}, {"tokens_per_s", tokens_per_s}}
             .dump()
      << "\n";
  out.flush();
}

/// bench/../scripts/plot_train.py beside the binary's source tree, or on $WEFT_PLOT_TRAIN.
std::optional<fs::path> plot_script() {
  if (const char* p = std::getenv("WEFT_PLOT_TRAIN"); p != nullptr) return fs::path{p};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.root_path();
       dir = dir.parent_path()) {
    if (fs::exists(dir / "scripts" / "plot_train.py")) return dir / "scripts" / "plot_train.py";
  }
  return std::nullopt;
}

/// The loop's configuration from the options.
sft_config config_of(const train_options& o, lr_schedule::shape shape) {
  sft_config sc;
  sc.seed = o.seed;
  sc.step_tokens = o.batch_tokens;
  sc.micro_batch_tokens = o.micro_batch_tokens;
  sc.schedule.peak = o.lr;
  sc.schedule.warmup_steps = o.warmup_steps;
  sc.schedule.total_steps = o.steps;
  sc.schedule.decay = shape;
  sc.schedule.min_ratio = o.min_lr_ratio;
  sc.adamw = {o.beta1, o.beta2, o.adam_eps, o.weight_decay};
  sc.max_grad_norm = o.max_grad_norm;
  return sc;
}

/// --resume: continues from the newest checkpoint that verifies (none: step 0, said so). False when
/// the checkpoint does not fit this run.
bool resume_from_checkpoint(const train_options& o, sft_trainer& trainer, const sft_config& sc) {
  std::vector<std::string> skipped;
  auto s = load_latest_checkpoint(o.checkpoint_dir, &skipped);
  for (const auto& why : skipped) spdlog::warn("{}; trying an older one", why);
  if (!s) {
    spdlog::warn("--resume: no checkpoint in {}; starting at step 0", o.checkpoint_dir);
    return true;
  }
  if (auto st = trainer.restore(*s); !st) {
    spdlog::error("cannot resume: {}", st.message());
    return false;
  }
  if (!(s->schedule == sc.schedule)) {
    spdlog::warn(
        "the checkpoint's run had another learning-rate schedule (lr {}, warmup {}, {} steps); "
        "this one (lr {}, warmup {}, {} steps) applies from step {}",
        s->schedule.peak, s->schedule.warmup_steps, s->schedule.total_steps, o.lr, o.warmup_steps,
        o.steps, s->step + 1);
  }
  spdlog::info("resumed from {} (step {}, epoch {}, example {} of the epoch)",
               checkpoint_path(o.checkpoint_dir, s->step).string(), s->step, s->cursor.epoch,
               s->cursor.index);
  return true;
}

/// --metrics-port: serves `prom` on 127.0.0.1 while it lives.
class metrics_server {
 public:
  explicit metrics_server(const train_metrics& prom) : prom_(prom) {}
  ~metrics_server() {
    if (thread_.joinable()) {
      http_.stop();
      thread_.join();
    }
  }
  metrics_server(const metrics_server&) = delete;
  metrics_server& operator=(const metrics_server&) = delete;

  bool start(int port) {
    http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(prom_.text(), "text/plain; version=0.0.4");
    });
    if (!http_.bind_to_port("127.0.0.1", port)) return false;
    thread_ = std::thread([this] { http_.listen_after_bind(); });
    return true;
  }

 private:
  const train_metrics& prom_;
  httplib::Server http_;
  std::thread thread_;
};

/// --save and --plot, after training.
int save_and_plot(const train_options& o, const gpu::gguf_file& file,
                  const trainable_model<float>& model, const fs::path& metrics_path) {
  if (!o.save_path.empty()) {
    if (auto st = export_gguf(file, model, *gpu::parse_type_name(o.save_type), o.save_path); !st) {
      spdlog::error("--save {}: {}", o.save_path, st.message());
      return 1;
    }
    spdlog::info("saved {} ({})", o.save_path, o.save_type);
  }
  if (!o.plot_path.empty()) {
    const auto script = plot_script();
    if (!script) {
      spdlog::error("--plot: scripts/plot_train.py not found (set WEFT_PLOT_TRAIN)");
      return 1;
    }
    const std::string cmd =
        "python3 '" + script->string() + "' '" + metrics_path.string() + "' '" + o.plot_path + "'";
    if (std::system(cmd.c_str()) != 0) {
      spdlog::error("--plot: {} failed (it needs matplotlib)", script->string());
      return 1;
    }
    spdlog::info("loss curve {}", o.plot_path);
  }
  return 0;
}

int run_train(const train_options& o) {
  lr_schedule::shape shape{};
  if (!parse_lr_shape(o.lr_schedule, shape)) {
    spdlog::error("--lr-schedule must be cosine or constant");
    return 2;
  }
  if (o.resume && o.checkpoint_dir.empty()) {
    spdlog::error("--resume needs --checkpoint-dir");
    return 2;
  }
  if (o.threads > 0) openblas_set_num_threads(o.threads);
  const fs::path path = o.model_path.empty() ? serve::default_model_path() : fs::path{o.model_path};
  spdlog::info("loading {}", path.string());
  auto file = gpu::gguf_file::open(path);
  if (!file) {
    spdlog::error("cannot open {}: {}", path.string(), file.error().to_string());
    return 1;
  }
  auto tok = gpu::tokenizer::from_gguf(*file);
  if (!tok) {
    spdlog::error("{}: {}", path.string(), tok.error().to_string());
    return 1;
  }
  auto chat = gpu::chat_template::from_gguf(*file);
  sft_data_config dc;
  dc.max_seq_tokens = o.max_seq_tokens;
  auto data = load_sft_jsonl(o.data_path, *tok, chat ? &*chat : nullptr, dc);
  if (!data) {
    spdlog::error("{}", data.error().message());
    return 2;
  }
  spdlog::info("data: {} examples, {} tokens, {} in the loss, {} cut to {} tokens",
               data->examples.size(), data->tokens, data->loss_tokens, data->truncated,
               o.max_seq_tokens);
  trainable_config tc;
  tc.recompute = o.recompute;
  auto model = trainable_model<float>::load(*file, tc);
  if (!model) {
    spdlog::error("{}: {}", path.string(), model.error().to_string());
    return 1;
  }
  spdlog::info(
      "model: {} parameters in f32 ({:.1f} MiB; with gradients and AdamW moments {:.1f} MiB)",
      (*model)->n_parameters(), (*model)->n_parameters() * 4.0 / (1 << 20),
      (*model)->n_parameters() * 16.0 / (1 << 20));
  const sft_config sc = config_of(o, shape);
  sft_trainer trainer(**model, *data, sc);
  if (o.resume && !resume_from_checkpoint(o, trainer, sc)) return 2;
  const fs::path metrics_path =
      !o.metrics_path.empty()
          ? fs::path{o.metrics_path}
          : (o.checkpoint_dir.empty() ? fs::path{"train-metrics.jsonl"}
                                      : fs::path{o.checkpoint_dir} / "metrics.jsonl");
  if (metrics_path.has_parent_path()) fs::create_directories(metrics_path.parent_path());
  // The metrics file is the checkpoint's history (what a resumed run continues) plus new steps.
  std::ofstream metrics_out(metrics_path, std::ios::trunc);
  for (const auto& r : trainer.history()) write_metrics_line(metrics_out, r, 0.0);

  train_metrics prom;
  std::optional<metrics_server> http;
  if (o.metrics_port > 0) {
    http.emplace(prom);
    if (!http->start(o.metrics_port)) {
      spdlog::error("--metrics-port {}: cannot listen on 127.0.0.1", o.metrics_port);
      return 2;
    }
    spdlog::info("metrics on http://127.0.0.1:{}/metrics", o.metrics_port);
  }

  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
  std::optional<async_checkpointer> ckpt;
  if (!o.checkpoint_dir.empty()) ckpt.emplace(o.checkpoint_dir, o.keep_checkpoints);
  auto checkpoint_now = [&](bool wait) -> bool {
    if (!ckpt) return true;
    if (auto st = ckpt->save([&](checkpoint_state& s) { trainer.snapshot_into(s); }); !st) {
      spdlog::error("checkpoint failed: {}", st.message());
      return false;
    }
    prom.add_checkpoint();
    if (wait) {
      if (auto st = ckpt->wait(); !st) {
        spdlog::error("checkpoint failed: {}", st.message());
        return false;
      }
      spdlog::info("checkpoint {}",
                   checkpoint_path(o.checkpoint_dir, trainer.steps_done()).string());
    }
    return true;
  };

  const int64_t first = trainer.steps_done();
  if (first >= o.steps) {
    spdlog::info("the checkpoint is at step {} and --steps is {}: no step left to train", first,
                 o.steps);
  }
  const auto t_start = std::chrono::steady_clock::now();
  int64_t tokens_done = 0;
  while (trainer.steps_done() < o.steps) {
    if (const int sig = g_stop_signal.load(); sig != 0) {
      spdlog::warn("{} at step {}: writing a checkpoint and stopping (continue with --resume)",
                   sig == SIGTERM ? "SIGTERM" : "SIGINT", trainer.steps_done());
      return checkpoint_now(true) ? 128 + sig : 1;
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto r = trainer.step();
    if (!r) {
      spdlog::error("step {}: {}", trainer.steps_done() + 1, r.error().message());
      return 1;
    }
    const auto now = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(now - t0).count();
    const double elapsed = std::chrono::duration<double>(now - t_start).count();
    tokens_done += r->tokens;
    const double tps = static_cast<double>(r->tokens) / std::max(dt, 1e-9);
    const double eta =
        elapsed / static_cast<double>(r->step - first) * static_cast<double>(o.steps - r->step);
    std::fprintf(stderr, "step %lld/%lld  loss %.4f  lr %.2e  |g| %.3f  %.0f tok/s  eta %s\n",
                 static_cast<long long>(r->step), static_cast<long long>(o.steps), r->loss, r->lr,
                 r->grad_norm, tps, format_duration(eta).c_str());
    write_metrics_line(metrics_out, *r, tps);
    prom.update(*r, tps);
    if (ckpt && (r->step % std::max<int64_t>(1, o.checkpoint_every) == 0 || r->step == o.steps)) {
      if (!checkpoint_now(r->step == o.steps)) return 1;
    }
  }
  if (ckpt) {
    if (auto st = ckpt->wait(); !st) {
      spdlog::error("checkpoint failed: {}", st.message());
      return 1;
    }
  }
  const double total_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  if (trainer.steps_done() > first) {
    spdlog::info("trained steps {}..{} in {} ({:.0f} tok/s); final loss {:.4f}", first + 1,
                 trainer.steps_done(), format_duration(total_s),
                 static_cast<double>(tokens_done) / std::max(total_s, 1e-9),
                 trainer.history().back().loss);
  }
  http.reset();
  return save_and_plot(o, *file, **model, metrics_path);
}

}  // namespace

void add_train_command(CLI::App& app, const global_options&) {
  auto o = std::make_shared<train_options>();
  auto* cmd = app.add_subcommand(
      "train", "Fine-tune a GGUF model on JSON-lines chat or prompt/completion data (SFT)");
  cmd->add_option("--config", o->config_file,
                  "TOML/INI file with any of these options, e.g. `lr = 1e-4`, at the top level or "
                  "under [train] (command-line flags win)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--model,-m", o->model_path,
                  "GGUF model to start from (default: $WEFT_MODEL, else the default model " +
                      std::string{serve::default_model_file} + ")");
  cmd->add_option("--data", o->data_path,
                  "JSON lines: {\"messages\": [...]} (assistant turns are learned) or "
                  "{\"prompt\", \"completion\"} (required)");
  cmd->add_option("--steps", o->steps, "Optimizer updates to reach")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--batch-tokens", o->batch_tokens,
                  "Tokens per optimizer update (whole examples; at least one)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--micro-batch-tokens", o->micro_batch_tokens,
                  "Tokens per forward/backward pass (gradients accumulate over them)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-seq-tokens", o->max_seq_tokens, "Longer examples are cut to this")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  cmd->add_option("--lr", o->lr, "Peak learning rate")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--warmup-steps", o->warmup_steps, "Linear warmup over this many updates")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--lr-schedule", o->lr_schedule, "After warmup: cosine or constant")
      ->capture_default_str()
      ->check(CLI::IsMember({"cosine", "constant"}));
  cmd->add_option("--min-lr-ratio", o->min_lr_ratio, "Cosine decays to lr x this at the last step")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--weight-decay", o->weight_decay,
                  "AdamW decoupled weight decay (matrices only, not norm weights)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--adam-beta1", o->beta1, "AdamW beta1")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--adam-beta2", o->beta2, "AdamW beta2")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--adam-eps", o->adam_eps, "AdamW epsilon")->capture_default_str();
  cmd->add_option("--max-grad-norm", o->max_grad_norm,
                  "Clip the global gradient norm to this (0: no clipping)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", o->seed, "Seed of the data order")->capture_default_str();
  cmd->add_option("--threads", o->threads, "BLAS threads (default: all cores)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--recompute", o->recompute,
                "Recompute each layer's activations in the backward (less memory, ~1/3 more "
                "compute)");
  cmd->add_option("--checkpoint-dir", o->checkpoint_dir,
                  "Write exact checkpoints here (and metrics.jsonl)");
  cmd->add_option("--checkpoint-every", o->checkpoint_every,
                  "Checkpoint every this many updates (and at the end, and on SIGTERM)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--keep-checkpoints", o->keep_checkpoints, "How many checkpoints to keep")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_flag("--resume", o->resume,
                "Continue from the newest valid checkpoint in --checkpoint-dir (if there is one)");
  cmd->add_option("--save", o->save_path, "Write the trained model here as GGUF");
  cmd->add_option("--save-type", o->save_type, "Weight type of --save: f32, f16, bf16 or q8_0")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}));
  cmd->add_option("--metrics", o->metrics_path,
                  "JSON lines of per-step metrics (default: CHECKPOINT_DIR/metrics.jsonl, else "
                  "./train-metrics.jsonl)");
  cmd->add_option("--metrics-port", o->metrics_port,
                  "Serve Prometheus metrics on 127.0.0.1:PORT/metrics while training")
      ->check(CLI::Range(1, 65535));
  cmd->add_option("--plot", o->plot_path,
                  "At the end, draw the loss and learning-rate curves to this PNG (needs "
                  "matplotlib)");
  cmd->callback([o, cmd] {
    if (!o->config_file.empty()) {
      if (auto st = apply_config_file(cmd, o->config_file); !st.ok()) {
        spdlog::error("--config: {}", st.message);
        std::exit(2);
      }
    }
    if (o->data_path.empty()) {
      spdlog::error("--data is required (on the command line or in --config)");
      std::exit(2);
    }
    std::exit(run_train(*o));
  });
}

}  // namespace weft::apps
