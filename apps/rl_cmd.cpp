// `weft rl`: GRPO post-training of a GGUF model on a procedural task or a prompt/answer dataset
// (docs/rl.md). In this process: a rollout engine that serves the trainer's current weights
// (updated in place after every step), rewards from built-in verifiers or an external process,
// one policy-gradient update per step (--mode sync, or --mode async with rollouts of the next K
// steps overlapping the update), exact checkpoints and --resume, held-out pass@1, metrics,
// plots, export.

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <unistd.h>

#include "actors/rl/tool_actors.hpp"
#include "actors/serve/model_host.hpp"
#include "apps/commands.hpp"
#include "apps/config_file.hpp"
#include "apps/reward_http.hpp"
#include "apps/rl_agents.hpp"
#include "apps/rl_options.hpp"
#include "apps/rl_report.hpp"
#include "apps/rl_wiring.hpp"
#include "apps/train_report.hpp"
#include "gpu/ggml_types.hpp"
#include "gpu/gguf.hpp"
#include "gpu/rl/grpo_loop.hpp"
#include "gpu/rl/reward_process.hpp"
#include "gpu/rl/tasks.hpp"
#include "gpu/rl/tools.hpp"
#include "gpu/train/checkpoint.hpp"
#include "gpu/train/export.hpp"
#include "gpu/train/sft_run.hpp"

namespace weft::apps {

namespace {

namespace fs = std::filesystem;
using namespace gpu::rl;

/// The task of the run: a dataset when --data is given, else a built-in procedural task.
std::unique_ptr<rl_task> make_base_task(const rl_options& o) {
  if (!o.data_path.empty()) {
    answer_match m{};
    parse_answer_match(o.match, m);
    auto t = load_prompt_dataset(o.data_path, m, o.reward_cmd.empty() && o.reward_url.empty());
    if (!t) {
      spdlog::error("--data: {}", t.error().message());
      return nullptr;
    }
    return std::move(*t);
  }
  if (o.task == "arithmetic") return make_arithmetic_task(o.digits, o.ops);
  if (o.task == "countdown") return make_countdown_task(o.numbers);
  if (o.task == "lookup") return make_lookup_task(o.words);
  return make_reverse_task(o.length);
}

/// The task, with --answer-format and --tools applied.
std::unique_ptr<rl_task> make_task(const rl_options& o) {
  auto tools = enabled_tools(o);
  if (!tools) {
    spdlog::error("{}", tools.error().message());
    return nullptr;
  }
  if (o.data_path.empty() && o.task == "lookup" &&
      std::find(tools->begin(), tools->end(), "lookup") == tools->end()) {
    spdlog::error("--task lookup asks for values only the lookup tool knows: add --tools lookup");
    return nullptr;
  }
  auto t = make_base_task(o);
  if (t && o.answer_format == "tags") t = make_answer_format_task(std::move(t), o.format_weight);
  if (t && !tools->empty()) t = make_tool_task(std::move(t), *tools);
  return t;
}

gpu::result<grpo_loop_config> make_loop_config(const rl_options& o) {
  grpo_loop_config c;
  c.seed = o.seed;
  c.prompts_per_step = o.prompts_per_step;
  c.group_size = o.group_size;
  c.max_new_tokens = o.max_new_tokens;
  c.temperature = o.temperature;
  c.top_p = o.top_p;
  c.top_k = o.top_k;
  c.fuse_reference = !o.no_fused_reference;
  c.async_rewards = !o.blocking_rewards;
  c.async_reference = !o.blocking_reference;
  c.external_reference = o.reference_workers > 0;
  c.eval_prompts = o.eval_prompts;
  c.chat = o.prompt_format == "chat";
  c.grpo.clip_low = o.clip_low;
  c.grpo.clip_high = o.clip_high;
  c.grpo.scale_rewards = !o.no_scale_rewards;
  c.grpo.drop_zero_variance = o.drop_zero_variance;
  c.grpo.max_new_tokens = o.max_new_tokens;
  parse_off_policy_correction(o.off_policy, c.grpo.correction);
  c.grpo.is_cap = o.is_cap;
  c.grpo.kl_coef = o.kl_coef;
  c.grpo.router_aux_loss_coef = o.router_aux_loss_coef;
  c.updates_per_step = o.updates_per_step;
  c.max_staleness = o.mode == "async" ? o.max_staleness : 0;
  c.stream = o.mode == "stream";
  c.total_steps = o.steps;
  if (!parse_loss_aggregation(o.loss_agg, c.grpo.aggregation)) {
    return gpu::status{gpu::status_code::invalid_argument, "--loss-agg " + o.loss_agg};
  }
  c.schedule.peak = o.lr;
  c.schedule.warmup_steps = o.warmup_steps;
  c.schedule.total_steps = o.steps;
  c.schedule.min_ratio = o.min_lr_ratio;
  if (!gpu::train::parse_lr_shape(o.lr_schedule, c.schedule.decay)) {
    return gpu::status{gpu::status_code::invalid_argument, "--lr-schedule " + o.lr_schedule};
  }
  c.adamw.weight_decay = o.weight_decay;
  c.max_grad_norm = o.max_grad_norm;
  c.micro_batch_tokens = o.micro_batch_tokens;
  c.shares = gpu::train::plan_threads(o.threads).shares;
  c.engine_threads = o.threads;
  c.train_device = o.device;
  c.rollout_device = o.rollout_device.empty() ? o.device : o.rollout_device;
  if (o.device != "cpu") c.shares = 1;  // one device: shares would run one after the other
  c.rollout_type = *gpu::parse_type_name(o.rollout_type);
  auto tools = enabled_tools(o);
  if (!tools) return tools.error();
  c.tools = *tools;
  c.max_tool_calls = o.max_tool_calls;
  c.batch_turns = o.tool_turns == "batch";
  c.rollout_max_running = o.rollout_max_running;
  c.trajectory_priority = o.trajectory_priority;
  c.routing_replay = o.routing_replay;
  return c;
}

/// --write-sft-data: problems of the training stream (never a held-out one) with their reference
/// answers, as {"prompt", "completion"} or {"messages"} lines for `weft train` (a warm start).
int write_sft_data(const rl_options& o, const rl_task& task) {
  prompt_source src(task, o.seed, o.eval_prompts);
  std::ofstream out(o.write_sft_path, std::ios::trunc);
  if (!out) {
    spdlog::error("--write-sft-data: cannot write {}", o.write_sft_path);
    return 2;
  }
  for (int64_t i = 0; i < o.sft_examples; ++i) {
    const rl_prompt p = src.next();
    nlohmann::json j;
    if (o.prompt_format == "chat") {
      j["messages"] = {{{"role", "user"}, {"content", p.text}},
                       {{"role", "assistant"}, {"content", task.reference_completion(p)}}};
    } else {
      j["prompt"] = p.text;
      j["completion"] = " " + task.reference_completion(p);
    }
    out << j.dump() << '\n';
  }
  spdlog::info("wrote {} examples of {} to {} (held-out problems excluded)", o.sft_examples,
               task.name(), o.write_sft_path);
  return 0;
}

/// --resume: continues from the newest checkpoint that verifies (none: step 0, said so). False
/// when the checkpoint does not fit this run.
bool resume_rl(const rl_options& o, grpo_loop& loop) {
  std::vector<std::string> skipped;
  auto s = gpu::train::load_latest_checkpoint(o.checkpoint_dir, &skipped);
  for (const auto& why : skipped) spdlog::warn("{}; trying an older one", why);
  if (!s) {
    spdlog::warn("--resume: no checkpoint in {}; starting at step 0", o.checkpoint_dir);
    return true;
  }
  if (auto st = loop.restore(*s); !st) {
    spdlog::error("cannot resume: {}", st.message());
    return false;
  }
  spdlog::info("resumed from {} (step {}, {} prompts drawn)",
               gpu::train::checkpoint_path(o.checkpoint_dir, s->step).string(), s->step,
               s->cursor.index);
  return true;
}

/// Opens the model (into `file`, which the export at the end reads again), loads its weights for
/// training and builds the loop; null with the exit status in `rc` when that fails.
std::unique_ptr<grpo_loop> open_loop(const rl_options& o, const rl_task& task,
                                     const grpo_loop_config& cfg,
                                     std::optional<gpu::gguf_file>& file, int& rc,
                                     std::shared_ptr<rollout_backend> backend) {
  spdlog::info("loading {}", o.model_path);
  auto opened = gpu::gguf_file::open(o.model_path);
  if (!opened) {
    spdlog::error("cannot open {}: {}", o.model_path, opened.error().message());
    rc = 1;
    return nullptr;
  }
  file.emplace(std::move(*opened));
  gpu::train::trainable_config tc;
  tc.router_aux_loss_coef = cfg.grpo.router_aux_loss_coef;
  auto weights = gpu::train::trainable_model<float>::load(*file, tc);
  if (!weights) {
    spdlog::error("{}: {}", o.model_path, weights.error().message());
    rc = 1;
    return nullptr;
  }
  if (o.agents > 0) {
    spdlog::info(
        "{} trainable parameters (f32) trained on {}; {} rollout agents on {} with {} "
        "weights",
        (*weights)->n_parameters(), cfg.train_device, o.agents, cfg.rollout_device, o.rollout_type);
  } else {
    spdlog::info(
        "{} trainable parameters (f32) trained on {}; rollout engine on {} with {} weights",
        (*weights)->n_parameters(), cfg.train_device, cfg.rollout_device, o.rollout_type);
  }
  auto made = grpo_loop::create(*file, std::move(*weights), task, cfg, std::move(backend));
  if (!made) {
    spdlog::error("{}", made.error().message());
    rc = made.error().code() == gpu::status_code::invalid_argument ? 2 : 1;
    return nullptr;
  }
  return std::move(*made);
}

/// Option combinations that cannot work, refused before anything starts (false: said why).
bool options_fit_together(const rl_options& o) {
  if (o.mode == "stream" && o.agents == 0) {
    spdlog::error(
        "--mode stream needs --agents N: its groups train while later groups generate, which "
        "in one process would only reorder the same work on the same cores (docs/rl.md, "
        "\"Modes\")");
    return false;
  }
  if (o.resume && o.checkpoint_dir.empty()) {
    spdlog::error("--resume needs --checkpoint-dir");
    return false;
  }
  if (o.agents == 0 && (o.agent_threads > 0 || !o.dispatch.empty() || o.weight_sync_timeout_s > 0 ||
                        o.netns || o.consolidate_tail > 0 || o.weight_fanout > 0)) {
    spdlog::error(
        "--agent-threads, --dispatch, --weight-sync-timeout-s, --weight-fanout, "
        "--consolidate-tail and --netns need --agents N");
    return false;
  }
  if (o.trajectory_priority) {
    spdlog::info(
        "trajectory priority: rollout engines run the trajectories predicted longest first{}",
        o.rollout_max_running > 0
            ? fmt::format(", {} sequences a pass", o.rollout_max_running)
            : std::string{" (they run every sequence at once: the order matters only when KV "
                          "runs short; --rollout-max-running caps a pass)"});
  }
  if (o.reward_workers > 0 && (o.agents == 0 || o.reward_cmd.empty())) {
    spdlog::error(
        "--reward-workers runs --reward-cmd on nodes of the cluster --agents N starts: "
        "it needs both");
    return false;
  }
  if (o.reward_procs > 1 && o.reward_cmd.empty()) {
    spdlog::error("--reward-procs runs copies of --reward-cmd: it needs --reward-cmd");
    return false;
  }
  if (o.reward_procs > 1 && o.blocking_rewards && o.reward_workers == 0) {
    spdlog::error(
        "--reward-procs scores batches at once on the reward threads; "
        "--blocking-rewards scores each in the loop: choose one");
    return false;
  }
  if (o.tool_workers > 0 &&
      (o.agents == 0 || (o.tools.empty() && o.tool_cmds.empty() && o.tool_urls.empty()))) {
    spdlog::error(
        "--tool-workers runs the tools (--tools, --tool-cmd, --tool-url) on nodes of the "
        "cluster --agents N starts: it needs both");
    return false;
  }
  if (o.blocking_reference && (o.reference_workers == 0 || o.no_fused_reference)) {
    spdlog::error(
        "--blocking-reference makes the loop wait for each group's call to the reference "
        "workers: it needs --reference-workers and a fused reference (not --no-fused-reference)");
    return false;
  }
  if (o.reference_workers > 0 && (o.agents == 0 || o.kl_coef == 0.0)) {
    spdlog::error(
        "--reference-workers computes the KL reference (--kl-coef) on nodes of the cluster "
        "--agents N starts: it needs --agents and --kl-coef");
    return false;
  }
  if (o.trainers > 1 && (o.agents == 0 || o.mode == "stream")) {
    spdlog::error(
        "--trainers K runs ranks 1..K-1 on nodes of the cluster --agents N starts; the group "
        "trains a whole step at a time (not --mode stream)");
    return false;
  }
  if ((!o.tools.empty() || !o.tool_cmds.empty() || !o.tool_urls.empty()) &&
      o.tool_latency_ms >= o.tool_timeout_s * 1000.0) {
    spdlog::error("--tool-latency-ms {} is past --tool-timeout-s {}: every call would time out",
                  o.tool_latency_ms, o.tool_timeout_s);
    return false;
  }
  if (o.netns && ::geteuid() != 0) {
    spdlog::error("--netns creates network namespaces and a bridge: it needs root (and iproute2)");
    return false;
  }
  return true;
}

/// --save: the trained weights as GGUF (false: said why).
bool save_model(const rl_options& o, const gpu::gguf_file& file, grpo_loop& loop) {
  if (auto st = loop.model().pull_to_host(nullptr); !st) {
    spdlog::error("--save {}: {}", o.save_path, st.message());
    return false;
  }
  if (auto st = gpu::train::export_gguf(file, loop.model(), *gpu::parse_type_name(o.save_type),
                                        o.save_path);
      !st) {
    spdlog::error("--save {}: {}", o.save_path, st.message());
    return false;
  }
  spdlog::info("saved {} ({})", o.save_path, o.save_type);
  return true;
}

/// The run's steps up to --steps, with its checkpoints (every --checkpoint-every steps, at the end
/// and on SIGTERM / SIGINT) and held-out evaluations. 0: trained (or nothing left to train);
/// otherwise the exit status. `reward_restarts`: restarts of the external reward since the start.
int train_steps(const rl_options& o, grpo_loop& loop, rl_reporter& report,
                rl_agent_cluster* cluster, weft::rl::tool_actors* tools,
                const std::function<int64_t()>& reward_restarts) {
  std::optional<gpu::train::async_checkpointer> ckpt;
  if (!o.checkpoint_dir.empty()) ckpt.emplace(o.checkpoint_dir, o.keep_checkpoints);
  auto checkpoint_now = [&](bool wait) -> bool {
    if (!ckpt) return true;
    // One the run waits for (the last, or on a signal) is written from the live tensors, without
    // the staging copy that lets training go on meanwhile.
    if (auto st = gpu::train::checkpoint_of(*ckpt, loop, wait); !st) {
      spdlog::error("checkpoint failed: {}", st.message());
      return false;
    }
    report.add_checkpoint();
    if (wait) {
      spdlog::info("checkpoint {}",
                   gpu::train::checkpoint_path(o.checkpoint_dir, loop.steps_done()).string());
    }
    return true;
  };
  auto evaluate = [&]() -> bool {
    if (o.eval_prompts <= 0) return true;
    auto e = loop.evaluate();
    if (!e) {
      spdlog::error("evaluation: {}", e.error().message());
      return false;
    }
    report.report_eval(*e);
    return true;
  };
  const int64_t first = loop.steps_done();
  if (first == 0 && o.eval_every > 0 && !evaluate()) return 1;
  while (loop.steps_done() < o.steps) {
    if (const int sig = stop_signal(); sig != 0) {
      spdlog::warn("{} at step {}: writing a checkpoint and stopping (continue with --resume)",
                   sig == SIGTERM ? "SIGTERM" : "SIGINT", loop.steps_done());
      return checkpoint_now(true) ? 128 + sig : 1;
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto r = loop.step();
    if (!r) {
      spdlog::error("step {}: {}", loop.steps_done() + 1, r.error().message());
      return 1;
    }
    r->reward_restarts = reward_restarts();
    if (cluster && cluster->rewards()) {
      r->reward_workers_lost = cluster->rewards()->workers_lost();
      r->reward_parts_rescored = cluster->rewards()->parts_rescored();
    }
    if (cluster && cluster->reference()) {
      r->reference_workers_lost = cluster->reference()->workers_lost();
      r->reference_batches_resent = cluster->reference()->batches_resent();
    }
    if (tools) {
      r->tool_restarts = tools->restarts();
      r->tool_calls_resent = tools->resent();
    }
    if (cluster && cluster->tools()) {
      r->tool_restarts = cluster->tools()->workers_lost();
      r->tool_calls_resent = cluster->tools()->resent();
    }
    report.report(*r, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    const bool last = r->step == o.steps;
    if (ckpt && (r->step % o.checkpoint_every == 0 || last) && !checkpoint_now(last)) return 1;
    if (o.eval_every > 0 && (r->step % o.eval_every == 0 || last) && !evaluate()) return 1;
  }
  if (ckpt) {
    if (auto st = ckpt->wait(); !st) {
      spdlog::error("checkpoint failed: {}", st.message());
      return 1;
    }
  }
  if (loop.steps_done() > first) {
    const double secs = report.seconds_since_start();
    spdlog::info("trained steps {}..{} in {} ({:.2f} samples/s)", first + 1, loop.steps_done(),
                 format_duration(secs),
                 static_cast<double>(report.samples_since_start()) / std::max(secs, 1e-9));
  } else {
    spdlog::info("the checkpoint is at step {} and --steps is {}: no step left to train", first,
                 o.steps);
  }
  return 0;
}

int run_rl(const rl_options& o) {
  if (!options_fit_together(o)) return 2;
  auto cfg = make_loop_config(o);
  if (!cfg) {
    spdlog::error("{}", cfg.error().message());
    return 2;
  }
  auto task = make_task(o);
  if (!task) return 2;
  if (!o.write_sft_path.empty()) return write_sft_data(o, *task);
  gpu::train::use_threads(o.threads);
  spdlog::info("task: {}; {} prompts x {} samples per step, up to {} new tokens", task->name(),
               o.prompts_per_step, o.group_size, o.max_new_tokens);
  if (o.mode == "async") {
    spdlog::info(
        "--mode async: the next {} step(s) generate while a step trains; off-policy "
        "correction {}",
        o.max_staleness, o.off_policy);
  }
  if (o.routing_replay || o.router_aux_loss_coef > 0.0) {
    // Refused before any agent starts: routes and a router exist only where experts do.
    auto f = gpu::gguf_file::open(o.model_path);
    auto hp = f ? gpu::read_model_hparams(*f) : gpu::result<gpu::model_hparams>(f.error());
    if (!hp) {
      spdlog::error("cannot open {}: {}", o.model_path, hp.error().message());
      return 1;
    }
    if (hp->n_experts == 0) {
      spdlog::error("{} needs a mixture-of-experts model; {} is dense",
                    o.routing_replay ? "--routing-replay" : "--router-aux-loss-coef", o.model_path);
      return 2;
    }
    if (o.routing_replay) {
      spdlog::info(
          "routing replay: the trainer routes each token to the experts the rollout engine used "
          "({} of {} per layer); the rollout engines record routes, kept beside their cached KV",
          hp->n_experts_used, hp->n_experts);
    }
  }
  // With --agents the rollout engines live in node processes started here; the cluster is
  // declared after the loop below, so it is stopped before the loop (its backend) is destroyed.
  std::unique_ptr<rl_agent_cluster> starting;
  if (o.agents > 0) {
    auto started = start_agents(o, *cfg);
    if (!started) {
      spdlog::error("rollout agents: {}", started.error().message);
      return 1;
    }
    starting = std::move(*started);
  }
  std::optional<gpu::gguf_file> file;
  int rc = 0;
  auto made = open_loop(o, *task, *cfg, file, rc, starting ? starting->backend() : nullptr);
  if (!made) return rc;
  const std::unique_ptr<rl_agent_cluster> cluster = std::move(starting);
  grpo_loop& loop = *made;
  std::optional<reward_process_pool> rewards;
  std::optional<reward_http> endpoint;
  if (!use_rewards(o, cluster.get(), loop, rewards, endpoint)) return 2;
  // Declared after what the rewards and the reference use (the process, the endpoint, the
  // cluster's reward and reference workers), so the loop's reward and reference threads stop
  // before any of them goes, whatever the return.
  const struct rewards_stopper {
    grpo_loop& loop;
    ~rewards_stopper() {
      loop.stop_rewards();
      loop.stop_references();
    }
  } stop_rewards_first{loop};
  if (!use_trainer_group(o, cluster.get(), loop)) return 2;
  use_reference(o, cluster.get(), loop);
  std::shared_ptr<weft::rl::tool_actors> tools;
  if (!start_tools(o, *cfg, loop, cluster.get(), tools)) return 2;
  if (o.resume && !resume_rl(o, loop)) return 2;
  const fs::path metrics = !o.metrics_path.empty() ? fs::path(o.metrics_path)
                           : !o.checkpoint_dir.empty()
                               ? fs::path(o.checkpoint_dir) / "metrics.jsonl"
                               : fs::path("rl-metrics.jsonl");
  rl_reporter report(metrics, o.steps, loop.steps_done());
  std::optional<metrics_server> http;
  if (!serve_metrics(o, report, cluster.get(), tools.get(), http)) return 2;
  catch_stop_signals();
  const auto reward_restarts = [&]() -> int64_t {
    return rewards ? rewards->restarts() : endpoint ? endpoint->retries() : 0;
  };
  if (const int st = train_steps(o, loop, report, cluster.get(), tools.get(), reward_restarts);
      st != 0) {
    return st;
  }
  http.reset();
  if (!o.save_path.empty() && !save_model(o, *file, loop)) return 1;
  if (!o.plot_path.empty() && !run_plot_script("plot_rl.py", report.path(), o.plot_path)) return 1;
  return 0;
}

}  // namespace

void add_rl_command(CLI::App& app, const global_options&) {
  auto opts = std::make_shared<rl_options>();
  auto* o = opts.get();
  auto* cmd = app.add_subcommand(
      "rl", "Post-train a GGUF model with GRPO on a procedural task or a prompt/answer dataset");
  cmd->add_option("--config", o->config_file,
                  "TOML/INI file with any of these options, e.g. `group-size = 8`, at the top "
                  "level or under [rl] (command-line flags win)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--model,-m", o->model_path,
                  "GGUF model to start from (default: $WEFT_MODEL, else the default model " +
                      std::string{serve::default_model_file} + ")");
  add_task_options(cmd, o);
  add_update_options(cmd, o);
  add_run_options(cmd, o);
  cmd->callback([opts, cmd] {
    auto* o = opts.get();
    if (!o->config_file.empty()) {
      if (auto st = apply_config_file(cmd, o->config_file); !st.ok()) {
        spdlog::error("--config: {}", st.message);
        std::exit(2);
      }
    }
    if (o->ops.empty() || o->ops.find_first_not_of("+-*") != std::string::npos) {
      spdlog::error("--ops must be a non-empty subset of +-* (got '{}')", o->ops);
      std::exit(2);
    }
    if ((!o->reward_cmd.empty() || !o->reward_url.empty()) &&
        cmd->get_option("--match")->count() > 0) {
      spdlog::warn("--match is ignored: {} scores the samples",
                   o->reward_url.empty() ? "--reward-cmd" : "--reward-url");
    }
    if (o->answer_format == "tags" && (!o->reward_cmd.empty() || !o->reward_url.empty())) {
      spdlog::warn(
          "--answer-format tags: the prompts ask for <answer> tags, but your reward "
          "scores the samples (the format reward is not added)");
    }
    if (o->answer_format == "none" && cmd->get_option("--format-weight")->count() > 0) {
      spdlog::error("--format-weight needs --answer-format tags");
      std::exit(2);
    }
    if (o->reward_url.empty() && cmd->get_option("--reward-key")->count() > 0) {
      spdlog::error("--reward-key needs --reward-url");
      std::exit(2);
    }
    if (o->mode != "async" && cmd->get_option("--max-staleness")->count() > 0) {
      spdlog::error(
          "--max-staleness needs --mode async (sync trains every sample on the "
          "weights that generated it)");
      std::exit(2);
    }
    if (o->off_policy == "decoupled" && o->updates_per_step > 1) {
      spdlog::error(
          "--off-policy decoupled takes one update per batch; --updates-per-step {} "
          "needs ppo-clip",
          o->updates_per_step);
      std::exit(2);
    }
    if (o->off_policy != "decoupled" && cmd->get_option("--is-cap")->count() > 0) {
      spdlog::error("--is-cap needs --off-policy decoupled");
      std::exit(2);
    }
    if (o->blocking_rewards && o->reward_cmd.empty() && o->reward_url.empty()) {
      spdlog::error(
          "--blocking-rewards needs --reward-cmd or --reward-url (the task's own verifier is "
          "called in place)");
      std::exit(2);
    }
    if (cmd->get_option("--reward-concurrency")->count() > 0 &&
        (o->reward_url.empty() || o->blocking_rewards)) {
      spdlog::error(
          "--reward-concurrency sets the requests in flight to --reward-url (not with "
          "--blocking-rewards, which sends one group at a time from the loop)");
      std::exit(2);
    }
    if (cmd->get_option("--reward-batch")->count() > 0 &&
        (o->reward_url.empty() || (o->blocking_rewards && o->reward_batch == "samples"))) {
      spdlog::error(
          "--reward-batch shapes the POSTs to --reward-url (and samples needs the reward "
          "threads: not with --blocking-rewards, which scores each group as it finishes)");
      std::exit(2);
    }
    if (o->no_fused_reference && o->kl_coef == 0.0) {
      spdlog::error("--no-fused-reference needs --kl-coef (without it there is no reference)");
      std::exit(2);
    }
    if (o->off_policy == "decoupled" && (cmd->get_option("--clip-low")->count() > 0 ||
                                         cmd->get_option("--clip-high")->count() > 0)) {
      spdlog::error(
          "--clip-low/--clip-high shape --off-policy ppo-clip; decoupled caps the "
          "importance weight with --is-cap instead");
      std::exit(2);
    }
    if (o->tools.empty() && o->tool_cmds.empty() && o->tool_urls.empty()) {
      for (const char* opt :
           {"--max-tool-calls", "--tool-latency-ms", "--tool-latency-dist", "--tool-timeout-s",
            "--tool-turns", "--tool-concurrency", "--tool-procs"}) {
        if (cmd->get_option(opt)->count() > 0) {
          spdlog::error("{} shapes the tool calls of --tools: give --tools too", opt);
          std::exit(2);
        }
      }
    }
    if (o->tool_cmds.empty() && cmd->get_option("--tool-procs")->count() > 0) {
      spdlog::error(
          "--tool-procs sets the processes of each --tool-cmd program: give --tool-cmd too");
      std::exit(2);
    }
    if (o->tool_urls.empty() && cmd->get_option("--tool-concurrency")->count() > 0) {
      spdlog::error(
          "--tool-concurrency sets the calls in flight at each --tool-url endpoint: give "
          "--tool-url too");
      std::exit(2);
    }
    if (o->trainers > 1 && o->device != "cpu") {
      // Device gradients reach host memory when the backward returns: the sum follows it.
      if (cmd->get_option("--bucket-mb")->count() > 0 && o->bucket_mb > 0.0) {
        spdlog::error(
            "--bucket-mb overlaps the gradient sum with the backward on the host; with --device "
            "the ranks' gradients reach host memory when the backward returns and are summed "
            "then (give --bucket-mb 0, or leave it out)");
        std::exit(2);
      }
      o->bucket_mb = 0.0;
    }
    if (o->trainers > 1 && o->dist_backend == "nccl" && o->device.rfind("cuda", 0) != 0) {
      spdlog::error(
          "--dist-backend nccl sums the gradients on the GPUs: it needs --device cuda (a GPU "
          "per rank)");
      std::exit(2);
    }
    if (o->trainers == 1) {
      for (const char* opt : {"--bucket-mb", "--allreduce-timeout-s", "--dist-backend"}) {
        if (cmd->get_option(opt)->count() > 0) {
          spdlog::error("{} shapes a trainer group's gradient sum: give --trainers K > 1 too", opt);
          std::exit(2);
        }
      }
    }
    if (o->task != "lookup" && cmd->get_option("--words")->count() > 0) {
      spdlog::error("--words is an option of --task lookup");
      std::exit(2);
    }
    if (!o->data_path.empty() && cmd->get_option("--task")->count() > 0) {
      spdlog::warn("--task is ignored: --data {} gives the prompts", o->data_path);
    }
    if (o->model_path.empty()) o->model_path = serve::default_model_path().string();
    if (o->threads == 0)
      o->threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    std::exit(run_rl(*o));
  });
}

}  // namespace weft::apps
