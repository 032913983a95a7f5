#!/usr/bin/env python3
"""Draws a `weft train` run's metrics (JSON lines: step, loss, lr, grad_norm, tokens_per_s) to a PNG:
the training loss per step (with a moving average, and the held-out loss of `"kind": "eval"` lines),
the learning rate, and the gradient norm."""
import json
import sys


def moving_average(values):
    """A trailing moving average over about a twentieth of the values: (window, averages)."""
    window = max(1, len(values) // 20)
    return window, [sum(values[max(0, i - window + 1):i + 1]) / (i + 1 - max(0, i - window + 1))
                    for i in range(len(values))]


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_train.py METRICS.jsonl OUT.png")
    lines = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    rows = [r for r in lines if "kind" not in r]
    evals = [r for r in lines if r.get("kind") == "eval"]
    if not rows:
        sys.exit(f"{sys.argv[1]}: no steps recorded")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    loss = [r["loss"] for r in rows]
    window, smooth = moving_average(loss)
    fig, axes = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    axes[0].plot(steps, loss, alpha=0.35, label="step loss")
    axes[0].plot(steps, smooth, label=f"moving average ({window} steps)")
    if evals:
        axes[0].plot([e["step"] for e in evals], [e["eval_loss"] for e in evals], "o-",
                     label="held-out loss (--eval-data)")
    axes[0].set_ylabel("mean token loss (nats)")
    axes[0].set_title("weft train: training loss")
    axes[0].legend()
    axes[1].plot(steps, [r["lr"] for r in rows])
    axes[1].set_ylabel("learning rate")
    axes[1].set_title("learning-rate schedule")
    axes[2].plot(steps, [r["grad_norm"] for r in rows])
    axes[2].set_ylabel("gradient norm (before clipping)")
    axes[2].set_xlabel("optimizer step")
    axes[2].set_title("global gradient norm")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=100)


if __name__ == "__main__":
    main()
