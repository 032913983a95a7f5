#!/usr/bin/env python3
"""GRPO samples/s of `weft rl --mode sync` against `--mode async --max-staleness K` (K = 1, 2) on the
same model, task, seed, prompts, group size and number of samples, in one run; the modes alternate
(sync, async 1, async 2, sync, ...) so the machine's drift hits all alike.

The task must have heavy-tailed output lengths, where sync mode pays for its long tail: the batch
drains to the few samples still generating while the rest of the step waits. By default that is
SmolLM2-135M-Instruct (the default model; rollouts in f32) on 1-digit addition (at the edge of its
competence) in its chat template with up to 96 new tokens: most replies are a short sentence, some explain at length.

Samples/s counts the training steps (model loading excluded). Rewards are each step's mean reward:
async trains on samples up to K versions old and must stay within noise of sync.

Writes JSON and PNG named <--name>-<date>.* into --out.
Usage: rl_modes.py --weft build/release/apps/weft [--steps 8] [--repeat 2] [--out docs]
           [--modes "sync,agents sync,agents async K=2" --name rl-agents] [--rollout-type q8_0]
           [--modes "sync slow reward blocking,sync slow reward" --reward-ms 50]
           [--modes "sync slow reward blocking,sync slow reward,sync slow reward 4 procs"]
           [--modes "sync slow endpoint blocking,sync slow endpoint 1 at once,sync slow endpoint"]
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

# Every mode this benchmark knows; --modes picks some (the first is the baseline of the ratios).
# "agents ...": rollouts on 2 rollout agents in their own node processes (1 thread each), the
# trainer in the `weft rl` process.
SLOW_REWARD = "{slow_reward}"  # replaced by the command of slow_reward.py with --reward-ms
SLOW_ENDPOINT = "{slow_endpoint}"  # replaced by the URL of `slow_reward.py --http`, started once
MODES = {
    "sync": [],
    "async K=1": ["--mode", "async", "--max-staleness", "1"],
    "async K=2": ["--mode", "async", "--max-staleness", "2"],
    "agents sync": ["--agents", "2"],
    "agents sync round-robin": ["--agents", "2", "--dispatch", "round-robin"],
    "agents stream": ["--agents", "2", "--mode", "stream"],
    "agents async K=2": ["--agents", "2", "--mode", "async", "--max-staleness", "2"],
    # Tail consolidation (RLHFuse): a step's last rollouts move onto one agent, at most N there.
    "agents sync consolidate 4": ["--agents", "2", "--consolidate-tail", "4"],
    "agents stream consolidate 4": ["--agents", "2", "--mode", "stream", "--consolidate-tail", "4"],
    "agents stream consolidate 8": ["--agents", "2", "--mode", "stream", "--consolidate-tail", "8"],
    # A KL term: the reference's forward per group as it finishes (fused, the default) or in the
    # training stage (the baseline).
    "agents sync KL unfused": ["--agents", "2", "--kl-coef", "0.04", "--no-fused-reference"],
    "agents sync KL fused": ["--agents", "2", "--kl-coef", "0.04"],
    "agents sync KL workers blocking": ["--agents", "2", "--kl-coef", "0.04",
                                        "--reference-workers", "2", "--blocking-reference"],
    "agents sync KL workers": ["--agents", "2", "--kl-coef", "0.04", "--reference-workers", "2"],
    "agents async K=2 KL workers blocking": ["--agents", "2", "--mode", "async",
                                             "--max-staleness", "2", "--kl-coef", "0.04",
                                             "--reference-workers", "2", "--blocking-reference"],
    "agents async K=2 KL workers": ["--agents", "2", "--mode", "async", "--max-staleness", "2",
                                    "--kl-coef", "0.04", "--reference-workers", "2"],
    "sync KL unfused": ["--kl-coef", "0.04", "--no-fused-reference"],
    "sync KL fused": ["--kl-coef", "0.04"],
    # A data-parallel trainer group: rank 0 in the weft rl process, rank 1 on a trainer node.
    "agents1 sync": ["--agents", "1"],
    # Weight versions to 3 agents: all from the controller (the baseline), or as a chain
    # (--weight-fanout 1: once from the controller, then agent to agent).
    "agents3 sync": ["--agents", "3"],
    "agents3 sync fanout 1": ["--agents", "3", "--weight-fanout", "1"],
    "agents3 sync fanout 2": ["--agents", "3", "--weight-fanout", "2"],
    # The same across network namespaces: every pull crosses the bridge over TCP.
    "agents3 sync netns": ["--agents", "3", "--netns"],
    "agents3 sync netns fanout 1": ["--agents", "3", "--netns", "--weight-fanout", "1"],
    "agents1 sync trainers 2": ["--agents", "1", "--trainers", "2"],
    # The group's all-reduce after the backward instead of in buckets during it (--bucket-mb 25).
    "agents1 sync trainers 2 buckets 0": ["--agents", "1", "--trainers", "2", "--bucket-mb", "0"],
    # An external reward that takes its time (bench/e2e/slow_reward.py, --reward-ms a sample):
    # scored on the loop's reward thread while the rollouts go on (the default), or waited for
    # as each group finishes (--blocking-rewards, the baseline).
    "sync slow reward blocking": ["--reward-cmd", SLOW_REWARD, "--blocking-rewards"],
    "sync slow reward": ["--reward-cmd", SLOW_REWARD],
    "async K=2 slow reward blocking": ["--mode", "async", "--max-staleness", "2",
                                       "--reward-cmd", SLOW_REWARD, "--blocking-rewards"],
    "async K=2 slow reward": ["--mode", "async", "--max-staleness", "2",
                              "--reward-cmd", SLOW_REWARD],
    "agents sync slow reward blocking": ["--agents", "2", "--reward-cmd", SLOW_REWARD,
                                         "--blocking-rewards"],
    "agents sync slow reward": ["--agents", "2", "--reward-cmd", SLOW_REWARD],
    # Four copies of the slow program beside the trainer, batches scored at once.
    "sync slow reward 4 procs": ["--reward-cmd", SLOW_REWARD, "--reward-procs", "4"],
    "async K=2 slow reward 4 procs": ["--mode", "async", "--max-staleness", "2",
                                      "--reward-cmd", SLOW_REWARD, "--reward-procs", "4"],
    # The same reward behind an HTTP endpoint (a thread per request): whole groups one at a
    # time from the loop, one at a time on the reward thread, 4 at once (the default), and
    # the finished samples 4 at once.
    "sync slow endpoint blocking": ["--reward-url", SLOW_ENDPOINT, "--blocking-rewards"],
    "sync slow endpoint 1 at once": ["--reward-url", SLOW_ENDPOINT, "--reward-concurrency", "1"],
    "sync slow endpoint": ["--reward-url", SLOW_ENDPOINT],
    "sync slow endpoint samples": ["--reward-url", SLOW_ENDPOINT, "--reward-batch", "samples"],
}


def run_weft(a, extra, metrics):
    cmd = [a.weft, "rl", "--model", a.model, "--task", "arithmetic", "--digits", str(a.digits),
           "--ops", a.ops, "--prompts-per-step", str(a.prompts), "--group-size", str(a.group),
           "--max-new-tokens", str(a.max_new), "--steps", str(a.steps), "--lr", str(a.lr),
           "--threads", str(a.threads), "--seed", str(a.seed), "--eval-every", "0",
           "--rollout-type", a.rollout_type, "--metrics", metrics]
    slow = (f"{sys.executable} {os.path.join(os.path.dirname(os.path.abspath(__file__)), 'slow_reward.py')}"
            f" --ms-per-sample {a.reward_ms}")
    cmd += [slow if x == SLOW_REWARD else a.endpoint if x == SLOW_ENDPOINT else x for x in extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=7200)
    if p.returncode != 0:
        sys.exit(f"weft rl {' '.join(extra)} failed:\n" + p.stderr[-3000:])
    steps = [json.loads(x) for x in open(metrics) if x.strip()]
    steps = [r for r in steps if r["kind"] == "step"]
    return {"seconds": sum(r["step_s"] for r in steps),
            "rewards": [r["reward"] for r in steps],
            "lengths": [r["completion_len"] for r in steps],
            "max_lengths": [r.get("completion_len_max", 0) for r in steps],
            "staleness": [r.get("staleness_mean", 0.0) for r in steps],
            "mixed_version_samples": sum(r.get("mixed_version_samples", 0) for r in steps),
            "rollouts_consolidated": steps[-1].get("rollouts_consolidated", 0) if steps else 0,
            "controller_weight_pulls": steps[-1].get("controller_weight_pulls", 0) if steps else 0,
            "peer_weight_pulls": steps[-1].get("peer_weight_pulls", 0) if steps else 0,
            "stage_seconds": {k: sum(r.get(k, 0.0) for r in steps)
                              for k in ["rollout_s", "train_s", "sync_s", "ref_s", "reduce_s",
                                        "reward_s", "reward_wait_s", "ref_wait_s"]}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weft", required=True)
    ap.add_argument("--model", default=os.environ.get("WEFT_MODEL", os.path.expanduser(
        "~/.cache/weft/models/SmolLM2-135M-Instruct.Q4_1.gguf")))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--digits", type=int, default=1)
    ap.add_argument("--ops", default="+")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rollout-type", default="f32",
                    help="weft rl --rollout-type: f16, bf16 or q8_0 give every mode the same "
                         "samples (batch-invariant kernels); f32 only to rounding")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--modes", default="sync,async K=1,async K=2",
                    help="comma-separated, from: " + ", ".join(MODES))
    ap.add_argument("--name", default="rl-modes", help="stem of the JSON and PNG files")
    ap.add_argument("--reward-ms", type=float, default=50.0,
                    help="the \"slow reward\" modes: milliseconds slow_reward.py takes a sample")
    a = ap.parse_args()
    chosen = [m.strip() for m in a.modes.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in MODES]
    if unknown or not chosen:
        sys.exit(f"--modes: unknown {unknown}; known: {', '.join(MODES)}")
    samples = a.steps * a.prompts * a.group
    runs = {name: [] for name in chosen}
    endpoint = None
    if any(SLOW_ENDPOINT in MODES[n] for n in chosen):
        endpoint = subprocess.Popen(
            [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "slow_reward.py"),
             "--http", "0", "--ms-per-sample", str(a.reward_ms)], stdout=subprocess.PIPE, text=True)
        a.endpoint = f"http://127.0.0.1:{endpoint.stdout.readline().split()[-1]}/score"
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.repeat):
            for name in chosen:
                r = run_weft(a, MODES[name], os.path.join(tmp, f"m-{i}.jsonl"))
                runs[name].append(r)
                print(f"{name:10s} run {i + 1}: {r['seconds']:.1f} s, "
                      f"{samples / r['seconds']:.2f} samples/s, mean reward "
                      f"{statistics.mean(r['rewards']):.3f}, mean length "
                      f"{statistics.mean(r['lengths']):.1f}; train {r['stage_seconds']['train_s']:.1f} s "
                      f"(all-reduce waited for {r['stage_seconds']['reduce_s']:.2f} s); rewards "
                      f"{r['stage_seconds']['reward_s']:.1f} s, waited for "
                      f"{r['stage_seconds']['reward_wait_s']:.1f} s; weight sync "
                      f"{r['stage_seconds']['sync_s']:.2f} s ({r['controller_weight_pulls']} pulls "
                      f"from the controller, {r['peer_weight_pulls']} from peers)", flush=True)
    if endpoint:
        endpoint.terminate()
        endpoint.wait()
    sps = {n: [samples / r["seconds"] for r in rs] for n, rs in runs.items()}
    base = statistics.median(sps[chosen[0]])
    out = {
        "benchmark": "rl_modes", "date": datetime.date.today().isoformat(),
        "model": os.path.basename(a.model),
        "task": f"{a.digits}-digit arithmetic ({a.ops}), chat template",
        "steps": a.steps, "prompts_per_step": a.prompts, "group_size": a.group,
        "max_new_tokens": a.max_new, "lr": a.lr, "threads": a.threads, "seed": a.seed,
        "rollout_type": a.rollout_type, "reward_ms_per_sample": a.reward_ms,
        "samples_per_run": samples, "baseline": chosen[0],
        "modes": {n: {"samples_per_s": sps[n], "runs": runs[n],
                      "args": MODES[n],
                      "ratio_to_sync": statistics.median(sps[n]) / base,
                      "mean_reward": statistics.mean(x for r in runs[n] for x in r["rewards"])}
                  for n in runs},
    }
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.join(a.out, f"{a.name}-{datetime.date.today().strftime('%Y%m%d')}")
    with open(stem + ".json", "w") as f:
        json.dump(out, f, indent=1)
    for n in runs:
        m = out["modes"][n]
        print(f"{n:10s} {statistics.median(sps[n]):.2f} samples/s = {m['ratio_to_sync']:.2f}x "
              f"{chosen[0]}; mean reward {m['mean_reward']:.3f}")
    print(f"wrote {stem}.json")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(1, 3, figsize=(15, 4))
        names = list(runs)
        ax[0].bar(names, [statistics.median(sps[n]) for n in names],
                  color=[f"C{k}" for k in range(len(names))])
        ax[0].tick_params(axis="x", labelrotation=15)
        ax[0].set_ylabel("samples / s (median of runs)")
        ax[0].set_title(f"GRPO on {os.path.basename(a.model)}, {a.threads} threads")
        for k, n in enumerate(names):
            for r in runs[n]:
                ax[1].plot(range(1, len(r["rewards"]) + 1), r["rewards"], f"C{k}", alpha=0.6)
            ax[1].plot([], [], f"C{k}", label=n)
        ax[1].set_xlabel("step")
        ax[1].set_ylabel("mean reward of the step's samples")
        ax[1].legend()
        stages = ["rollout_s", "train_s", "sync_s"]
        bottom = [0.0] * len(names)
        for k, st in enumerate(stages):
            vals = [statistics.median(r["stage_seconds"][st] for r in runs[n]) for n in names]
            ax[2].bar(names, vals, bottom=bottom, label=st[:-2], color=f"C{k + 3}")
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax[2].tick_params(axis="x", labelrotation=15)
        ax[2].set_ylabel("seconds per run (median)")
        ax[2].set_title("where the time goes")
        ax[2].legend()
        fig.tight_layout()
        fig.savefig(stem + ".png", dpi=110)
    except ImportError:
        print("matplotlib missing: no PNG")


if __name__ == "__main__":
    main()
