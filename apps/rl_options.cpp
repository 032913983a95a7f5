#include "apps/rl_options.hpp"

#include "apps/commands.hpp"

namespace weft::apps {

/// Where prompts and rewards come from.
void add_task_options(CLI::App* cmd, rl_options* o) {
  cmd->add_option("--task", o->task,
                  "Built-in task: arithmetic (\"What is 4 + 7?\"), reverse (a string of "
                  "letters), countdown (reach a target from given numbers) or lookup (sum the "
                  "values of words only the lookup tool knows; needs --tools lookup); ignored "
                  "when --data is given")
      ->capture_default_str()
      ->check(CLI::IsMember({"arithmetic", "reverse", "countdown", "lookup"}));
  cmd->add_option("--words", o->words,
                  "lookup: each problem sums the values of 1 to this many words")
      ->capture_default_str()
      ->check(CLI::Range(1, 4));
  cmd->add_option("--tools", o->tools,
                  "Agentic rollouts: tools the model may call between turns, from calc (writes "
                  "<calc>expression</calc>) and lookup (<lookup>word</lookup>); generation stops "
                  "at the closing tag, the tool actor's result follows as <result>value</result> "
                  "(context, not in the loss) and the sample continues (docs/rl.md)");
  cmd->add_option("--tool-cmd", o->tool_cmds,
                  "A tool of your own, NAME=COMMAND (repeatable; enables it): the command (run "
                  "with /bin/sh -c) reads {\"id\", \"tool\", \"args\"} JSON lines on stdin and "
                  "writes {\"id\", \"result\"} lines; the model calls it as <NAME>args</NAME>. "
                  "A built-in's name replaces the built-in (docs/rl.md)");
  cmd->add_option("--tool-url", o->tool_urls,
                  "A tool of your own behind an HTTP endpoint, NAME=http://host:port/path "
                  "(repeatable; enables it): each call is POSTed as {\"id\", \"tool\", "
                  "\"args\"} and answered by {\"result\": \"...\"}; --tool-concurrency calls "
                  "at once (docs/rl.md)");
  cmd->add_option("--tool-concurrency", o->tool_concurrency,
                  "--tool-url: calls each endpoint gets at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("--tool-procs", o->tool_procs,
                  "--tool-cmd: processes of each program (each serves one call at a time; a "
                  "call goes to the least busy)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--tool-workers", o->tool_workers,
                  "--tools with --agents: run the tools (built-in, --tool-cmd programs, "
                  "--tool-url clients) on this many nodes of the run's cluster (supervised tool "
                  "workers; a lost worker's calls go to another) instead of in this process")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--max-tool-calls", o->max_tool_calls,
                  "--tools: calls per sample; a turn that calls once more ends the sample")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
  cmd->add_option("--tool-latency-ms", o->tool_latency_ms,
                  "--tools: each call's service time in the tool actors (a tool behind a "
                  "network); the other samples keep generating meanwhile")
      ->capture_default_str()
      ->check(CLI::Range(0, 600000));
  cmd->add_option("--tool-latency-dist", o->tool_latency_dist,
                  "--tools: fixed (every call takes --tool-latency-ms) or exponential (that mean, "
                  "a long tail: some calls take several times as long; drawn per call)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fixed", "exponential"}));
  cmd->add_option("--tool-timeout-s", o->tool_timeout_s,
                  "--tools: a call unanswered this long is sent again (3 tries, then the model "
                  "sees an error as the tool's result)")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 3600.0));
  cmd->add_option("--tool-turns", o->tool_turns,
                  "--tools: sample (each sample's call starts when its turn ends and it continues "
                  "as soon as the result is in, while the others generate) or batch (the "
                  "batch-synchronous loop of Search-R1-style trainers, for comparison: calls wait "
                  "until no sample generates, continuations until the last result)")
      ->capture_default_str()
      ->check(CLI::IsMember({"sample", "batch"}));
  cmd->add_option("--rollout-max-running", o->rollout_max_running,
                  "Sequences each rollout engine runs in one forward pass, like vLLM's "
                  "max_num_seqs (0 = every sample in flight at once); beyond it requests queue, "
                  "as on a GPU short of KV")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  cmd->add_flag("--trajectory-priority", o->trajectory_priority,
                "Heddle's trajectory-level scheduling: rollout engines run the requests of the "
                "trajectories predicted longest first (from each prompt's past samples, raised as "
                "a trajectory outgrows its prediction), refreshed at every tool-call turn, instead "
                "of first come, first served; matters where requests queue "
                "(--rollout-max-running, or KV)");
  cmd->add_flag("--routing-replay", o->routing_replay,
                "Mixture-of-experts models: the trainer routes every token to the experts the "
                "rollout engine used (routing replay, R3) instead of re-routing it; the rollout "
                "engines record routes and keep them beside their cached KV");
  cmd->add_option("--digits", o->digits, "arithmetic: digits of each operand")
      ->capture_default_str()
      ->check(CLI::Range(1, 9));
  cmd->add_option("--ops", o->ops, "arithmetic: operators to draw from, a subset of +-*")
      ->capture_default_str();
  cmd->add_option("--numbers", o->numbers, "countdown: numbers given (each from 1 to 25)")
      ->capture_default_str()
      ->check(CLI::Range(2, 6));
  cmd->add_option("--length", o->length, "reverse: letters in the string")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--answer-format", o->answer_format,
                  "none, or tags: the prompt asks for the final answer inside <answer></answer> "
                  "and the reward is --format-weight for that format plus the rest for a right "
                  "answer inside it (DeepSeek-R1's format reward)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "tags"}));
  cmd->add_option("--format-weight", o->format_weight,
                  "--answer-format tags: the reward of the format alone")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--data", o->data_path,
                  "JSON lines {\"prompt\": ..., \"answer\": ...} instead of a built-in task (the "
                  "last --eval-prompts lines are held out)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--match", o->match,
                  "--data: how an answer is checked: number (the last number in the reply), "
                  "exact (the first line) or contains")
      ->capture_default_str()
      ->check(CLI::IsMember({"number", "exact", "contains"}));
  cmd->add_option("--reward-cmd", o->reward_cmd,
                  "Score samples with this command instead of the task's verifier: it reads "
                  "{\"id\", \"prompt\", \"completion\", \"answer\"} JSON lines on stdin and "
                  "writes {\"id\", \"reward\"} lines (run with /bin/sh -c; docs/rl.md)");
  cmd->add_option("--reward-url", o->reward_url,
                  "Score samples by POSTing {\"samples\": [{\"id\", \"prompt\", \"completion\", "
                  "\"answer\"}]} to this http:// URL, which answers {\"rewards\": [...]} in order "
                  "(docs/rl.md)")
      ->excludes("--reward-cmd");
  cmd->add_option("--reward-key", o->reward_key,
                  "--reward-url: sent as 'Authorization: Bearer KEY' (or WEFT_REWARD_KEY)")
      ->envname("WEFT_REWARD_KEY");
  cmd->add_option("--reward-timeout-s", o->reward_timeout_s,
                  "--reward-cmd: a batch not fully answered within this many seconds restarts the "
                  "process; --reward-url: the request's timeout")
      ->capture_default_str()
      ->check(positive_number);
  cmd->add_option("--reward-restarts", o->reward_restarts,
                  "--reward-cmd: restarts allowed per batch (crash or timeout) before the run "
                  "fails; --reward-url: retries of a failed request (no answer, 5xx, 429)")
      ->capture_default_str()
      ->check(CLI::Range(0, 100));
  cmd->add_option("--reward-workers", o->reward_workers,
                  "--reward-cmd with --agents: run the reward program on this many nodes of the "
                  "run's cluster (supervised reward workers; a lost worker's samples are scored "
                  "again by another) instead of beside the trainer")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--reward-procs", o->reward_procs,
                  "--reward-cmd: copies of the program beside the trainer, each scoring one batch "
                  "at a time (a batch goes to a free copy; the rewards are the same); with "
                  "--reward-workers: copies on each reward node, a part split over them")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--reward-concurrency", o->reward_concurrency,
                  "--reward-url: batches POSTed at once (each on its own connection; the "
                  "endpoint must serve them concurrently, or they wait there)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--reward-batch", o->reward_batch,
                  "--reward-url: what one POST holds: group (a whole group once its last sample "
                  "finishes; the endpoint may compare them) or samples (the samples that "
                  "finished since the previous POST, each scored on its own)")
      ->capture_default_str()
      ->check(CLI::IsMember({"group", "samples"}));
  cmd->add_flag("--blocking-rewards", o->blocking_rewards,
                "--reward-cmd / --reward-url: stop generating while a finished group is scored "
                "(the baseline) instead of scoring it on a thread of its own as the rollouts go "
                "on; the rewards are the same (docs/rl.md)");
  cmd->add_option("--trainers", o->trainers,
                  "Data-parallel trainer ranks (with --agents): rank 0 in this process, ranks "
                  "1..K-1 on trainer nodes of the run's cluster under a one-for-all supervisor; "
                  "gradients are summed over UCX in rank order, and a lost rank restarts the group "
                  "and repeats the update exactly")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--bucket-mb", o->bucket_mb,
                  "--trainers > 1: sum the gradients in buckets of about this many MiB while the "
                  "backward still runs (as PyTorch DDP's bucket_cap_mb; weft train's option); 0: "
                  "all at once after the backward. Same results either way")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--dist-backend", o->dist_backend,
                  "--trainers > 1 with --device cuda: where the gradients are summed — nccl: on "
                  "the GPUs, in place, every rank training device-resident (weights, gradients "
                  "and AdamW in device memory; each rank needs a GPU of its own); ucx: copied "
                  "into host memory, summed over UCX and AdamW on the host; auto: nccl where "
                  "every rank can, else ucx (rank 0 logs which and why)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "nccl", "ucx"}));
  cmd->add_option("--allreduce-timeout-s", o->allreduce_timeout_s,
                  "--trainers: a gradient all-reduce not done within this many seconds counts "
                  "as a lost rank (the group restarts)")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 3600.0));
  cmd->add_option("--prompt-format", o->prompt_format,
                  "chat (each prompt is a user message in the model's chat template) or raw (the "
                  "prompt text as is)")
      ->capture_default_str()
      ->check(CLI::IsMember({"chat", "raw"}));
  cmd->add_option("--write-sft-data", o->write_sft_path,
                  "Instead of training: write --sft-examples solved problems of the task (never "
                  "held-out ones) as JSON lines for `weft train` (an SFT warm start), then exit");
  cmd->add_option("--sft-examples", o->sft_examples, "Examples --write-sft-data writes")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{10'000'000}));
}

/// The mode, the batch and the update.
void add_update_options(CLI::App* cmd, rl_options* o) {
  cmd->add_option("--mode", o->mode,
                  "sync (generate a step's samples, score, train, sync weights), stream (with "
                  "--agents: each group trains as soon as it is scored while the rest of the "
                  "step generates) or async (the rollouts of the next --max-staleness steps keep "
                  "generating while a step trains)")
      ->capture_default_str()
      ->check(CLI::IsMember({"sync", "stream", "async"}));
  cmd->add_option("--max-staleness", o->max_staleness,
                  "--mode async: K, how many weight versions a trained sample may lag (its "
                  "oldest token); rollouts of steps n+1..n+K overlap the training of step n")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{64}));
  cmd->add_option("--off-policy", o->off_policy,
                  "ppo-clip (PPO-clip on the ratio to the behaviour policy) or decoupled "
                  "(importance weight min(ratio, --is-cap) on each token's gradient, AReaL's "
                  "decoupled objective with one update per batch)")
      ->capture_default_str()
      ->check(CLI::IsMember({"ppo-clip", "decoupled"}));
  cmd->add_option("--updates-per-step", o->updates_per_step,
                  "Optimizer steps on each step's rollouts (TRL's num_iterations): after the "
                  "first, the PPO ratio leaves 1 and the clip range bounds the move. Exact resume "
                  "needs the same value")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{64}));
  cmd->add_option("--kl-coef", o->kl_coef,
                  "Weight of a KL penalty to the starting model (TRL's beta): each token adds "
                  "beta x k3(ref, policy); 0 keeps no reference model in memory")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  cmd->add_option(
         "--reference-workers", o->reference_workers,
         "--kl-coef with --agents: compute the KL reference on this many nodes of the "
         "run's cluster (supervised; a lost worker's batches go to another) instead of "
         "holding it in this process, on their node's --device. Same bits as the in-process "
         "reference")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--router-aux-loss-coef", o->router_aux_loss_coef,
                  "Mixture of experts: weight of the router's load-balancing loss (as weft "
                  "train's), added per micro-batch weighted like its policy loss; 0: none. A "
                  "dense model refuses a nonzero value")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  cmd->add_flag("--no-fused-reference", o->no_fused_reference,
                "--kl-coef: compute the reference's log-probs in the training stage instead of "
                "as each group finishes (the baseline of the fusion; docs/rl.md)");
  cmd->add_flag("--blocking-reference", o->blocking_reference,
                "--reference-workers: wait for each finished group's reference call in the loop "
                "instead of making it from a thread of its own while the rollouts go on (the "
                "baseline; same bits)");
  cmd->add_option("--is-cap", o->is_cap,
                  "--off-policy decoupled: the truncated importance weight's cap")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 1000.0));
  cmd->add_option("--steps", o->steps, "GRPO steps (one optimizer update each)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--prompts-per-step", o->prompts_per_step, "Prompts drawn per step")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd->add_option("--group-size", o->group_size,
                  "Samples per prompt (advantages are relative to the group)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{1024}));
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "Longest completion")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--temperature", o->temperature,
                  "Rollout sampling temperature; the recorded behaviour log-probs and the "
                  "trainer's log-probs (PPO ratio, KL) are both of softmax(logits / T). Held-out "
                  "evaluation stays greedy")
      ->capture_default_str()
      ->check(CLI::Range(0.01f, 10.0f));
  cmd->add_option("--top-p", o->top_p,
                  "Rollouts draw from the smallest set of tokens with this much probability (1: "
                  "off); a filter only, not part of the trained policy (as in TRL and verl)")
      ->capture_default_str()
      ->check(CLI::Range(0.001f, 1.0f));
  cmd->add_option("--top-k", o->top_k,
                  "Rollouts draw from the k most likely tokens (0: off); a filter, like --top-p")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--lr", o->lr, "Peak learning rate")
      ->capture_default_str()
      ->check(positive_number);
  cmd->add_option("--warmup-steps", o->warmup_steps, "Linear warmup over this many steps")
      ->capture_default_str()
      ->check(non_negative_number);
  cmd->add_option("--lr-schedule", o->lr_schedule, "After warmup: constant or cosine")
      ->capture_default_str()
      ->check(CLI::IsMember({"cosine", "constant"}));
  cmd->add_option("--min-lr-ratio", o->min_lr_ratio, "Cosine decays to lr x this at the last step")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--weight-decay", o->weight_decay, "AdamW decoupled weight decay (matrices)")
      ->capture_default_str()
      ->check(non_negative_number);
  cmd->add_option("--max-grad-norm", o->max_grad_norm, "Clip the global gradient norm (0: off)")
      ->capture_default_str()
      ->check(non_negative_number);
  cmd->add_option("--clip-low", o->clip_low, "PPO ratio floor is 1 - this")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--clip-high", o->clip_high,
                  "PPO ratio ceiling is 1 + this (DAPO's clip-higher: 0.28)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 10.0));
  cmd->add_option("--loss-agg", o->loss_agg,
                  "token (mean over all tokens of the step), sequence (mean of per-sample means, "
                  "the GRPO paper) or constant (sum / (samples x max new tokens), Dr. GRPO)")
      ->capture_default_str()
      ->check(CLI::IsMember({"token", "sequence", "constant"}));
  cmd->add_flag("--no-scale-rewards", o->no_scale_rewards,
                "Do not divide advantages by the group's reward std (Dr. GRPO)");
  cmd->add_flag("--drop-zero-variance", o->drop_zero_variance,
                "Leave groups whose rewards are all equal out of the loss and its normaliser");
  cmd->add_option("--eval-every", o->eval_every,
                  "Greedy pass@1 on the held-out prompts before training, every this many steps "
                  "and at the end (0: never)")
      ->capture_default_str()
      ->check(non_negative_number);
  cmd->add_option("--eval-prompts", o->eval_prompts, "Held-out prompts (never trained on)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{100000}));
  cmd->add_option("--seed", o->seed, "Seed of prompts and samples")->capture_default_str();
  cmd->add_option("--threads", o->threads,
                  "Cores to use (default: all): the rollout engine's threads, and up to 4 "
                  "parallel shares of the backward. Exact resume needs the same value")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--device", o->device,
                  "Where the trainer runs: cpu, or cuda / cuda:N (forward, backward and AdamW in "
                  "device memory; with --trainers K every rank trains there — `cuda` without an "
                  "index is each rank's own GPU on its host — and the group sums on the GPUs or "
                  "through host memory, see --dist-backend; the KL reference and its workers run "
                  "there too)")
      ->capture_default_str();
  cmd->add_option(
      "--rollout-device", o->rollout_device,
      "Where the rollout engine generates: cpu, cuda or cuda:N (default: --device). "
      "On a GPU, --rollout-type bf16 is refused (the CUDA engine does not multiply it)");
  cmd->add_option("--micro-batch-tokens", o->micro_batch_tokens,
                  "Tokens per forward/backward pass of the update")
      ->capture_default_str()
      ->check(positive_number);
  cmd->add_option("--rollout-type", o->rollout_type,
                  "Weight type of the rollout engine: f32 (closest to the trainer), bf16, f16 or "
                  "q8_0 (quantized rollouts: fastest on a CPU; the behaviour log-probs differ "
                  "most from the trainer's, which the PPO ratio corrects)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16", "f16", "q8_0"}));
  cmd->add_option("--agents", o->agents,
                  "Rollout agents, each in its own `weft node` process on this host (placed and "
                  "restarted by a supervisor; weights pushed over UCX after every step). 0: the "
                  "rollout engine runs in this process")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  cmd->add_option("--agent-threads", o->agent_threads,
                  "--agents: compute threads of each agent (default 1)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--dispatch", o->dispatch,
                  "--agents: length-aware (a prompt's group goes, predicted-longest first, to "
                  "the least-loaded agent; default) or round-robin")
      ->check(CLI::IsMember({"length-aware", "round-robin"}));
  cmd->add_option("--consolidate-tail", o->consolidate_tail,
                  "--agents: tail consolidation (RLHFuse): once a step's unfinished rollouts fit "
                  "on half of the agents holding them, at most N an agent, the rest move there "
                  "(replaying their tokens so far) and the freed agents take the next rollouts "
                  "or leave their cores to the trainer (default 0: off; docs/rl.md)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--weight-fanout", o->weight_fanout,
                  "--agents: F agents pull each new weight version from the trainer's process, "
                  "the others from agents that already hold it, at most F at a time from each — "
                  "a tree through the agents — so the version leaves the trainer's process F "
                  "times instead of once per agent (default 0: every agent pulls from the "
                  "trainer's process at once)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--weight-sync-timeout-s", o->weight_sync_timeout_s,
                  "--agents: an agent that has not pulled and applied a new weight version "
                  "within this many seconds is restarted (default 60)")
      ->check(CLI::Range(1.0, 3600.0));
  cmd->add_flag("--netns", o->netns,
                "--agents: run each agent's node process in a network namespace of its own "
                "(root and iproute2): agents reach the controller and each other over a bridge "
                "(TCP), so cutting an agent's link is a real network partition (docs/rl.md)");
}

/// Checkpoints, export and what the run shows.
void add_run_options(CLI::App* cmd, rl_options* o) {
  cmd->add_option("--checkpoint-dir", o->checkpoint_dir,
                  "Write exact checkpoints here (and metrics.jsonl)");
  cmd->add_option("--checkpoint-every", o->checkpoint_every,
                  "Checkpoint every this many steps (and at the end, and on SIGTERM)")
      ->capture_default_str()
      ->check(positive_number);
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
                  "JSON lines of per-step and evaluation metrics (default: "
                  "CHECKPOINT_DIR/metrics.jsonl, else ./rl-metrics.jsonl)");
  cmd->add_option("--metrics-port", o->metrics_port,
                  "Serve Prometheus metrics on 127.0.0.1:PORT/metrics while training")
      ->check(CLI::Range(1, 65535));
  cmd->add_option("--plot", o->plot_path,
                  "At the end, draw reward, pass@1, lengths and time per stage to this PNG "
                  "(needs matplotlib)");
}

}  // namespace weft::apps
