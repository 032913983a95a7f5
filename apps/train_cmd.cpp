// `weft train`: supervised fine-tuning of a GGUF model on JSON-lines data in this process
// (docs/training.md): AdamW, warmup + cosine schedule, clipping, exact checkpoints, GGUF export.
// --trainers K > 1 hands the run to a data-parallel trainer group (apps/train_group.cpp).

#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "actors/serve/model_host.hpp"
#include "apps/commands.hpp"
#include "apps/config_file.hpp"
#include "apps/train_options.hpp"
#include "apps/train_report.hpp"
#include "gpu/ggml_types.hpp"
#include "gpu/train/checkpoint.hpp"
#include "gpu/train/export.hpp"
#include "gpu/train/sft_data.hpp"
#include "gpu/train/sft_run.hpp"
#include "gpu/train/sft_trainer.hpp"

namespace weft::apps {

namespace {

namespace fs = std::filesystem;
using namespace gpu::train;

/// --resume: continues from the newest checkpoint that verifies (none: step 0, said so). False when
/// the checkpoint does not fit this run.
bool resume_from_checkpoint(const sft_run_options& o, sft_trainer& trainer, const sft_config& sc) {
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

int run_train(const train_options& opts) {
  const sft_run_options& o = opts.run;
  auto sc = make_sft_config(o);
  if (!sc) {
    spdlog::error("{}", sc.error().message());
    return 2;
  }
  if (opts.resume && o.checkpoint_dir.empty()) {
    spdlog::error("--resume needs --checkpoint-dir");
    return 2;
  }
  if (opts.remote_trainers > 0 && !o.eval_data_path.empty()) {
    spdlog::error(
        "--eval-data with --remote-trainers: not yet (the eval file is not sent to the other "
        "hosts' ranks; evaluate the --save export, docs/training.md)");
    return 2;
  }
  if (opts.trainers > 1) return run_train_group(opts);
  use_threads(o);
  const thread_plan plan = plan_threads(o.threads);
  spdlog::info("{} thread(s): {} share(s) of each update in parallel, {} BLAS thread(s) each",
               o.threads, plan.shares, plan.blas);
  spdlog::info("loading {}", o.model_path);
  auto run = load_sft_run(o);
  if (!run) {
    spdlog::error("{}", run.error().message());
    return run.error().code() == gpu::status_code::invalid_argument ? 2 : 1;
  }
  sft_trainer trainer(*run->model, run->data, *sc);
  if (opts.resume && !resume_from_checkpoint(o, trainer, *sc)) return 2;
  step_reporter report(metrics_path_of(opts.metrics_path, o.checkpoint_dir), o.steps);
  // The metrics file is the checkpoint's history (what a resumed run continues) plus new steps.
  report.start_at(trainer.steps_done(), trainer.history());
  std::optional<metrics_server> http;
  if (opts.metrics_port > 0) {
    http.emplace(report.prom());
    if (!http->start(opts.metrics_port)) {
      spdlog::error("--metrics-port {}: cannot listen on 127.0.0.1", opts.metrics_port);
      return 2;
    }
    spdlog::info("metrics on http://127.0.0.1:{}/metrics", opts.metrics_port);
  }

  catch_stop_signals();
  std::optional<async_checkpointer> ckpt;
  if (!o.checkpoint_dir.empty()) ckpt.emplace(o.checkpoint_dir, o.keep_checkpoints);
  auto checkpoint_now = [&](bool wait) -> bool {
    if (!ckpt) return true;
    // One the run waits for (the last, or on a signal) is written from the live tensors, without
    // the staging copy that lets training go on meanwhile.
    if (auto st = checkpoint_of(*ckpt, trainer, wait); !st) {
      spdlog::error("checkpoint failed: {}", st.message());
      return false;
    }
    report.prom().add_checkpoint();
    if (wait) {
      spdlog::info("checkpoint {}",
                   checkpoint_path(o.checkpoint_dir, trainer.steps_done()).string());
    }
    return true;
  };

  // --eval-data: the held-out loss before the first update of this run, every --eval-every
  // updates and after the last.
  auto evaluate = [&]() -> bool {
    if (o.eval_data_path.empty()) return true;
    auto e = evaluate_loss(*run->model, run->eval_data, o.micro_batch_tokens);
    if (!e) {
      spdlog::error("--eval-data {}: {}", o.eval_data_path, e.error().message());
      return false;
    }
    e->step = trainer.steps_done();
    report.report_eval(*e);
    return true;
  };

  const int64_t first = trainer.steps_done();
  if (first < o.steps && !evaluate()) return 1;
  if (first >= o.steps) {
    spdlog::info("the checkpoint is at step {} and --steps is {}: no step left to train", first,
                 o.steps);
  }
  while (trainer.steps_done() < o.steps) {
    if (const int sig = stop_signal(); sig != 0) {
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
    report.report(*r, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (ckpt && (r->step % o.checkpoint_every == 0 || r->step == o.steps)) {
      if (!checkpoint_now(r->step == o.steps)) return 1;
    }
    if ((r->step == o.steps || (o.eval_every > 0 && r->step % o.eval_every == 0)) && !evaluate())
      return 1;
  }
  if (ckpt) {
    if (auto st = ckpt->wait(); !st) {
      spdlog::error("checkpoint failed: {}", st.message());
      return 1;
    }
  }
  if (trainer.steps_done() > first) {
    const double total_s = report.seconds_since_start();
    spdlog::info("trained steps {}..{} in {} ({:.0f} tok/s); final loss {:.4f}", first + 1,
                 trainer.steps_done(), format_duration(total_s),
                 static_cast<double>(report.tokens_since_start()) / std::max(total_s, 1e-9),
                 trainer.history().back().loss);
  }
  http.reset();
  if (!o.save_path.empty()) {
    if (auto st = trainer.sync_host(); !st) {
      spdlog::error("--save {}: {}", o.save_path, st.message());
      return 1;
    }
    if (auto st =
            export_gguf(run->file, *run->model, *gpu::parse_type_name(o.save_type), o.save_path);
        !st) {
      spdlog::error("--save {}: {}", o.save_path, st.message());
      return 1;
    }
    spdlog::info("saved {} ({})", o.save_path, o.save_type);
  }
  if (!opts.plot_path.empty() && !plot_training(report.path(), opts.plot_path)) return 1;
  return 0;
}

}  // namespace

void add_train_command(CLI::App& app, const global_options&) {
  auto opts = std::make_shared<train_options>();
  auto* o = &opts->run;
  o->threads = 0;  // all cores (divided among --trainers), resolved when the command runs
  auto* cmd = app.add_subcommand(
      "train", "Fine-tune a GGUF model on JSON-lines chat or prompt/completion data (SFT)");
  cmd->add_option("--config", opts->config_file,
                  "TOML/INI file with any of these options, e.g. `lr = 1e-4`, at the top level or "
                  "under [train] (command-line flags win)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--model,-m", o->model_path,
                  "GGUF model to start from (default: $WEFT_MODEL, else the default model " +
                      std::string{serve::default_model_file} + ")");
  cmd->add_option("--data", o->data_path,
                  "JSON lines: {\"messages\": [...]} (assistant turns are learned) or "
                  "{\"prompt\", \"completion\"} (required)");
  cmd->add_option("--eval-data", o->eval_data_path,
                  "Held-out JSON lines in --data's format: their mean token loss (and perplexity) "
                  "is logged and written to the metrics before the first update, every "
                  "--eval-every updates and after the last")
      ->check(CLI::ExistingFile);
  cmd->add_option("--eval-every", o->eval_every,
                  "With --eval-data: evaluate every this many updates too (0: only before the "
                  "first and after the last)")
      ->capture_default_str()
      ->check(non_negative_number);
  cmd->add_option("--steps", o->steps, "Optimizer updates to reach")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--batch-tokens", o->batch_tokens,
                  "Tokens per optimizer update (whole examples; at least one)")
      ->capture_default_str()
      ->check(positive_number);
  cmd->add_option("--micro-batch-tokens", o->micro_batch_tokens,
                  "Tokens per forward/backward pass (gradients accumulate over them)")
      ->capture_default_str()
      ->check(positive_number);
  cmd->add_option("--max-seq-tokens", o->max_seq_tokens, "Longer examples are cut to this")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  cmd->add_option("--lr", o->lr, "Peak learning rate")
      ->capture_default_str()
      ->check(positive_number);
  cmd->add_option("--warmup-steps", o->warmup_steps, "Linear warmup over this many updates")
      ->capture_default_str()
      ->check(non_negative_number);
  cmd->add_option("--lr-schedule", o->lr_schedule, "After warmup: cosine or constant")
      ->capture_default_str()
      ->check(CLI::IsMember({"cosine", "constant"}));
  cmd->add_option("--min-lr-ratio", o->min_lr_ratio, "Cosine decays to lr x this at the last step")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--weight-decay", o->weight_decay,
                  "AdamW decoupled weight decay (matrices only, not norm weights)")
      ->capture_default_str()
      ->check(non_negative_number);
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
      ->check(non_negative_number);
  cmd->add_option("--seed", o->seed, "Seed of the data order")->capture_default_str();
  cmd->add_option("--threads", o->threads,
                  "Cores each trainer uses (default: all cores, divided among --trainers); up to 4 "
                  "shares of each update run in parallel, the rest are BLAS threads. Exact resume "
                  "needs the same value")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--device", o->device,
                  "Where training runs: cpu, or cuda / cuda:N (weights, gradients and AdamW in "
                  "device memory; with --trainers, cuda gives each rank its own GPU of its "
                  "host, cuda:N puts every rank on GPU N)")
      ->capture_default_str();
  cmd->add_flag("--offload-optimizer", o->offload_optimizer,
                "With --device: keep the master weights and AdamW on the host (less device "
                "memory, more host-device traffic; DeepSpeed's ZeRO-Offload)");
  cmd->add_flag("--recompute", o->recompute,
                "Recompute each layer's activations in the backward (less memory, ~1/3 more "
                "compute)");
  cmd->add_option("--router-aux-loss-coef", o->router_aux_loss_coef,
                  "Mixture-of-experts models: weight of the router's load-balancing loss "
                  "(transformers' router_aux_loss_coef, e.g. 0.02; 0: none). A dense model "
                  "refuses a nonzero value")
      ->check(non_negative_number)
      ->capture_default_str();
  cmd->add_option("--checkpoint-dir", o->checkpoint_dir,
                  "Write exact checkpoints here (and metrics.jsonl)");
  cmd->add_option("--checkpoint-every", o->checkpoint_every,
                  "Checkpoint every this many updates (and at the end, and on SIGTERM)")
      ->capture_default_str()
      ->check(positive_number);
  cmd->add_option("--keep-checkpoints", o->keep_checkpoints, "How many checkpoints to keep")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_flag("--resume", opts->resume,
                "Continue from the newest valid checkpoint in --checkpoint-dir (if there is one)");
  cmd->add_option("--save", o->save_path, "Write the trained model here as GGUF");
  cmd->add_option("--save-type", o->save_type, "Weight type of --save: f32, f16, bf16 or q8_0")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}));
  cmd->add_option("--trainers", opts->trainers,
                  "Data-parallel trainer processes (> 1: a local cluster of `weft node` processes, "
                  "gradients all-reduced over the transport, gang restart from the last checkpoint "
                  "when one dies)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--dist-backend", o->dist_backend,
                  "--trainers > 1: where the gradients are summed: nccl (on the GPUs, in place; "
                  "every rank on a GPU of its own, --device cuda), ucx (through host memory over "
                  "the transport), auto (nccl when every rank can, else ucx, saying why)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "nccl", "ucx"}));
  cmd->add_option("--bucket-mb", o->bucket_mb,
                  "--trainers > 1, summing through host memory: sum the gradients in buckets of "
                  "about this many MiB while the backward still runs (as PyTorch DDP's "
                  "bucket_cap_mb); 0: all at once after the backward. Same results either way")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--allreduce-timeout-ms", opts->allreduce_timeout_ms,
                  "--trainers > 1: a gradient all-reduce that does not finish by then fails the "
                  "step (the group restarts)")
      ->capture_default_str()
      ->check(CLI::Range(100u, 3'600'000u));
  cmd->add_option("--max-restarts", opts->max_restarts,
                  "--trainers > 1: group restarts (and node relaunches) allowed per minute")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  cmd->add_option("--ucx-tls", opts->ucx_tls,
                  "--trainers > 1: UCX transports of the all-reduce (e.g. shm, tcp; default: UCX's "
                  "choice)");
  cmd->add_option(
         "--remote-trainers", opts->remote_trainers,
         "--trainers > 1: of the K ranks, N run on nodes that other hosts join with "
         "`weft node --join BIND:HEAD_PORT --roles trainer` (needs --bind, --secret-file; "
         "a host without the model or the data at the same paths receives them from rank 0; "
         "rank 0 and the checkpoints stay on this host; docs/training.md)")
      ->check(CLI::Range(1, 63));
  cmd->add_option("--bind", opts->bind,
                  "--remote-trainers: the address the run's head and coordinator listen on (one "
                  "the other hosts reach)")
      ->capture_default_str();
  cmd->add_option("--head-port", opts->head_port,
                  "--remote-trainers: the head's port the other hosts join (default: any free "
                  "port, printed)");
  cmd->add_option("--secret-file", opts->secret_file,
                  "--remote-trainers: the cluster secret (at least 16 bytes) the joining nodes "
                  "use too");
  cmd->add_option("--join-timeout-s", opts->join_timeout_s,
                  "--remote-trainers: how long to wait for the remote ranks' nodes to join")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 86400.0));
  cmd->add_option(
      "--ucx-net-devices", opts->ucx_net_devices,
      "--trainers > 1: network devices of the local ranks' all-reduce (UCX_NET_DEVICES, "
      "e.g. eth0; default: UCX's choice)");
  cmd->add_option("--metrics", opts->metrics_path,
                  "JSON lines of per-step metrics (default: CHECKPOINT_DIR/metrics.jsonl, else "
                  "./train-metrics.jsonl)");
  cmd->add_option("--metrics-port", opts->metrics_port,
                  "Serve Prometheus metrics on 127.0.0.1:PORT/metrics while training")
      ->check(CLI::Range(1, 65535));
  cmd->add_option("--plot", opts->plot_path,
                  "At the end, draw the loss and learning-rate curves to this PNG (needs "
                  "matplotlib)");
  cmd->callback([opts, cmd] {
    auto* o = &opts->run;
    if (!opts->config_file.empty()) {
      if (auto st = apply_config_file(cmd, opts->config_file); !st.ok()) {
        spdlog::error("--config: {}", st.message);
        std::exit(2);
      }
    }
    if (o->data_path.empty()) {
      spdlog::error("--data is required (on the command line or in --config)");
      std::exit(2);
    }
    if (o->eval_data_path.empty() && cmd->get_option("--eval-every")->count() > 0) {
      spdlog::error("--eval-every needs --eval-data");
      std::exit(2);
    }
    if (o->model_path.empty()) o->model_path = serve::default_model_path().string();
    if (opts->trainers == 1) {
      // The group's options do nothing for one process: say so rather than drop them silently.
      for (const char* name : {"--allreduce-timeout-ms", "--max-restarts", "--ucx-tls",
                               "--ucx-net-devices", "--dist-backend", "--bucket-mb"}) {
        if (cmd->get_option(name)->count() > 0) {
          spdlog::warn("{} applies to trainer groups only (--trainers > 1); ignored", name);
        }
      }
    }
    if (opts->trainers > 1 && o->dist_backend == "nccl" &&
        (o->device.rfind("cuda", 0) != 0 || o->offload_optimizer)) {
      spdlog::error(
          "--dist-backend nccl sums the gradients on the GPUs: it needs --device cuda (a GPU "
          "per rank) without --offload-optimizer");
      std::exit(2);
    }
    const bool remote_opts = cmd->get_option("--bind")->count() > 0 ||
                             cmd->get_option("--head-port")->count() > 0 ||
                             cmd->get_option("--secret-file")->count() > 0 ||
                             cmd->get_option("--join-timeout-s")->count() > 0;
    if (opts->remote_trainers > 0 &&
        (opts->trainers < 2 || opts->remote_trainers >= opts->trainers ||
         opts->secret_file.empty() || opts->bind == "127.0.0.1")) {
      spdlog::error(
          "--remote-trainers N needs --trainers K > N (at least one rank runs here), "
          "--secret-file (the secret the joining nodes share) and --bind (an address the "
          "other hosts reach)");
      std::exit(2);
    }
    if (opts->remote_trainers == 0 && remote_opts) {
      spdlog::error(
          "--bind, --head-port, --secret-file and --join-timeout-s need --remote-trainers");
      std::exit(2);
    }
    if (o->threads == 0) {
      const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
      const int local = std::max(1, opts->trainers - opts->remote_trainers);
      o->threads = std::max(1, cores / local);
    }
    std::exit(run_train(*opts));
  });
}

}  // namespace weft::apps
