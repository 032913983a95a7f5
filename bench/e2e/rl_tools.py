#!/usr/bin/env python3
"""Agentic rollouts: `weft rl --tools` with weft's per-sample turns (each sample's tool call starts
when its turn ends and it continues as soon as its result is in, while the others generate)
against the batch-synchronous turns of Search-R1-style trainers (`--tool-turns batch`: calls wait
until no sample generates, all continuations start after the last result), on the same model,
task, prompts and seeds, in one run, alternated (sample, batch, sample, ...).

The model: a generated 4-layer model warm-started with `weft train` on solved problems of
`--task lookup --words 3 --tools lookup,calc` (sum the values of 1 to 3 words only the lookup tool
knows: 2 to 4 calls a sample, the last to the calculator), as docs/rl.md's tool recipe does. Each
tool call takes --latency-ms on average, exponentially distributed (a long-tailed tool) or fixed.

Reports samples/s over the training steps (model loading excluded), the rollout seconds, tool calls
per sample and mean reward, with the ratio of per-sample to batch turns; the samples are the same
in both (the turns' order changes when tokens are computed, not which).

`--compare modes` runs `--mode async --max-staleness 2` against `--mode sync` (both with per-sample
turns): the next steps' samples generate while a step's last trajectories wait for their tools.

`--compare priority` instead runs weft's per-sample turns with each rollout engine capped at
`--max-running` sequences a pass (requests beyond it queue, as on a GPU short of KV), first come
first served against `--trajectory-priority` (Heddle's trajectory-level scheduling: the
trajectories predicted longest first, raised as they outgrow the prediction), alternated.

Writes JSON and PNG named rl-tools-<date>.* (rl-trajectory-priority-<date>.* with --compare
priority) into --out.
Usage: rl_tools.py --weft build/release/apps/weft [--make-model build/release/tests/weft_make_tiny_model]
           [--latencies 0,100,300] [--dist exponential] [--steps 6] [--repeat 2] [--out docs]
           [--compare turns|priority] [--max-running 8]
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(cmd, timeout=3600):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n" + (p.stdout + p.stderr)[-3000:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weft", required=True)
    ap.add_argument("--make-model", default=None,
                    help="weft_make_tiny_model (default: beside weft's build)")
    ap.add_argument("--latencies", default="0,100,300", help="mean ms per tool call")
    ap.add_argument("--dist", default="exponential", choices=["fixed", "exponential"])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--compare", default="turns", choices=["turns", "priority", "modes"],
                    help="turns: per-sample vs batch turns; priority: --trajectory-priority vs "
                         "first come, first served under --max-running; modes: --mode async "
                         "--max-staleness 2 vs --mode sync (per-sample turns)")
    ap.add_argument("--words", type=int, default=3,
                    help="lookup: up to this many words per problem (a call each, then calc)")
    ap.add_argument("--tools", default="lookup,calc",
                    help="the tools the samples may call (the recipe's: lookup)")
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--max-running", type=int, default=8,
                    help="--compare priority: each rollout engine's sequences per pass")
    a = ap.parse_args()
    if a.compare == "turns":
        variants = {"sample": ["--tool-turns", "sample"], "batch": ["--tool-turns", "batch"]}
        name, baseline = "rl-tools", "--tool-turns batch"
    elif a.compare == "modes":
        variants = {"async K=2": ["--tool-turns", "sample", "--mode", "async",
                                  "--max-staleness", "2"],
                    "sync": ["--tool-turns", "sample", "--mode", "sync"]}
        name, baseline = "rl-tools-modes", "--mode sync"
    else:
        cap = ["--tool-turns", "sample", "--rollout-max-running", str(a.max_running)]
        variants = {"priority": cap + ["--trajectory-priority"], "fcfs": cap}
        name, baseline = "rl-trajectory-priority", f"--rollout-max-running {a.max_running}, fcfs"
    if a.words != 3:
        name += f"-words{a.words}"
    if a.tools != "lookup,calc":
        name += "-" + a.tools.replace(",", "+")
    first, second = list(variants)
    maker = a.make_model or os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(a.weft))), "tests", "weft_make_tiny_model")
    task = ["--task", "lookup", "--words", str(a.words), "--tools", a.tools,
            "--prompt-format", "raw", "--eval-prompts", "50", "--seed", "0",
            "--max-tool-calls", str(max(4, a.words + 1))]
    latencies = [int(x) for x in a.latencies.split(",") if x.strip()]
    samples = a.steps * a.prompts * a.group
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "tiny.gguf")
        run([maker, base, "--layers", "4", "--embd", "128", "--context", "1024"])
        sft = os.path.join(tmp, "sft.jsonl")
        run([a.weft, "rl", "--model", base] + task + ["--write-sft-data", sft,
                                                      "--sft-examples", "8000"])
        warm = os.path.join(tmp, "warm.gguf")
        print("warm start: weft train, 300 steps ...", flush=True)
        run([a.weft, "train", "--model", base, "--data", sft, "--steps", "300", "--lr", "3e-3",
             "--warmup-steps", "20", "--batch-tokens", "8192", "--micro-batch-tokens", "4096",
             "--threads", str(a.threads), "--save", warm, "--save-type", "f32"])
        for lat in latencies:
            for i in range(a.repeat):
                for turns, flags in variants.items():
                    m = os.path.join(tmp, f"m-{lat}-{turns}-{i}.jsonl")
                    run([a.weft, "rl", "--model", warm] + task +
                        ["--steps", str(a.steps), "--prompts-per-step", str(a.prompts),
                         "--group-size", str(a.group), "--max-new-tokens", "128", "--lr", str(a.lr),
                         "--threads", str(a.threads), "--eval-every", "0",
                         "--tool-latency-ms", str(lat), "--tool-latency-dist", a.dist,
                         "--metrics", m] + flags)
                    rows = [json.loads(x) for x in open(m) if x.strip()]
                    rows = [r for r in rows if r["kind"] == "step"]
                    r = {"seconds": sum(x["step_s"] for x in rows),
                         "rollout_s": sum(x["rollout_s"] for x in rows),
                         "tool_calls": sum(x["tool_calls"] for x in rows),
                         "tool_kv_reuse": statistics.mean(x["tool_kv_reuse"] for x in rows),
                         "rewards": [x["reward"] for x in rows]}
                    r["samples_per_s"] = samples / r["seconds"]
                    results.setdefault(str(lat), {}).setdefault(turns, []).append(r)
                    print(f"{lat:4d} ms {turns:6s} run {i + 1}: {r['samples_per_s']:.2f} samples/s, "
                          f"rollouts {r['rollout_s']:.2f} s, {r['tool_calls'] / samples:.2f} "
                          f"calls/sample, KV reuse {r['tool_kv_reuse']:.2f}", flush=True)
    summary = {}
    for lat, by in results.items():
        med = {t: statistics.median(x["samples_per_s"] for x in rs) for t, rs in by.items()}
        summary[lat] = {"samples_per_s": med, f"ratio_{first}_to_{second}": med[first] / med[second],
                        "calls_per_sample": by[first][0]["tool_calls"] / samples,
                        "mean_reward": statistics.mean(by[first][0]["rewards"]),
                        "mean_reward_by_variant": {
                            t: statistics.mean(statistics.mean(x["rewards"]) for x in rs)
                            for t, rs in by.items()}}
        print(f"{lat:>4s} ms mean latency ({a.dist}): {first} {med[first]:.2f} samples/s, "
              f"{second} {med[second]:.2f} = {med[first] / med[second]:.2f}x")
    out = {"benchmark": "rl_tools", "date": datetime.date.today().isoformat(),
           "model": "generated 4-layer 128-wide, SFT warm start on the tool task",
           "task": f"lookup, 1-{a.words} words, tools {a.tools}, raw prompts", "lr": a.lr,
           "latency_distribution": a.dist, "steps": a.steps, "prompts_per_step": a.prompts,
           "group_size": a.group, "max_new_tokens": 128, "threads": a.threads,
           "samples_per_run": samples, "baseline": baseline,
           "variants": variants,
           "summary": summary, "runs": results}
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.join(a.out, f"{name}-{datetime.date.today().strftime('%Y%m%d')}")
    with open(stem + ".json", "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {stem}.json")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        lats = list(summary)
        width = 0.38
        for k, turns in enumerate(variants):
            ax.bar([i + (k - 0.5) * width for i in range(len(lats))],
                   [summary[x]["samples_per_s"][turns] for x in lats], width,
                   label=" ".join(variants[turns]), color=f"C{k}")
        ax.set_xticks(range(len(lats)))
        ax.set_xticklabels([f"{x} ms" for x in lats])
        ax.set_xlabel(f"mean tool latency ({a.dist})")
        ax.set_ylabel("samples / s (median of runs)")
        ax.set_title("Agentic GRPO rollouts: per-sample vs batch-synchronous turns"
                     if a.compare == "turns" else
                     "Agentic GRPO: --mode async --max-staleness 2 vs sync"
                     if a.compare == "modes" else
                     f"Agentic GRPO rollouts, {a.max_running} sequences a pass: "
                     "trajectory priority vs FCFS")
        ax.legend()
        fig.tight_layout()
        fig.savefig(stem + ".png", dpi=110)
        print(f"wrote {stem}.png")
    except ImportError:
        print("matplotlib not installed: no PNG")


if __name__ == "__main__":
    main()
