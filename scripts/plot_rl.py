#!/usr/bin/env python3
"""Draws a `weft rl` run's metrics (JSON lines with "kind": "step" or "eval") to a PNG: the mean
training reward per step with the held-out greedy pass@1, the completion length, the time per
step split into generation / training / weight sync, and the PPO clip fraction."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot_train import moving_average  # noqa: E402


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_rl.py METRICS.jsonl OUT.png")
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    steps = [r for r in rows if r.get("kind") == "step"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    if not steps:
        sys.exit(f"{sys.argv[1]}: no steps recorded")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["step"] for r in steps]
    reward = [r["reward"] for r in steps]
    window, smooth = moving_average(reward)
    fig, axes = plt.subplots(4, 1, figsize=(8, 11), sharex=True)
    axes[0].plot(x, reward, alpha=0.35, label="training reward (mean of the step's samples)")
    axes[0].plot(x, smooth, label=f"moving average ({window} steps)")
    if evals:
        axes[0].plot([e["step"] for e in evals], [e["pass_at_1"] for e in evals], "o-",
                     label="held-out pass@1 (greedy)")
    axes[0].set_ylabel("reward")
    axes[0].set_title("weft rl (GRPO)")
    axes[0].legend(fontsize=8)
    axes[1].plot(x, [r["completion_len"] for r in steps])
    axes[1].set_ylabel("completion tokens")
    gen = [r["rollout_s"] for r in steps]
    train = [r["train_s"] for r in steps]
    sync = [r["sync_s"] for r in steps]
    axes[2].stackplot(x, gen, train, sync, labels=["generate", "score + train", "weight sync"])
    axes[2].set_ylabel("seconds per step")
    axes[2].legend(fontsize=8, loc="upper left")
    axes[3].plot(x, [100 * r["clip_fraction"] for r in steps], label="clipped tokens %")
    axes[3].plot(x, [100 * r["ratio_deviation"] for r in steps],
                 label="mean |ratio - 1| % (trainer vs rollout engine)")
    axes[3].set_ylabel("%")
    axes[3].set_xlabel("step")
    axes[3].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
