#!/usr/bin/env python3
"""Draws a `weft chaos` report (JSON) to a PNG timeline: generated tokens/s of completed requests,
explicit errors and lost requests when they ended, the faults (kill, stop) with the span until the
router saw the process serving again, and how many workers served at each moment."""
import json
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_chaos.py REPORT.json OUT.png")
    rep = json.load(open(sys.argv[1]))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reqs = rep["requests"]
    end = max([r["done_s"] for r in reqs] + [s["t_s"] for s in rep["timeline"]] + [1.0])
    bins = int(end) + 1
    tokens = [0.0] * bins
    for r in reqs:
        if r["outcome"] in ("completed", "wrong_tokens") and r["completion_tokens"] > 0:
            # Spread each request's tokens over its lifetime: a throughput curve, not spikes.
            t0, t1 = r["sent_s"], max(r["done_s"], r["sent_s"] + 1e-3)
            per_s = r["completion_tokens"] / (t1 - t0)
            for b in range(int(t0), min(int(t1) + 1, bins)):
                overlap = min(t1, b + 1) - max(t0, b)
                if overlap > 0:
                    tokens[b] += per_s * overlap
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 1]})
    if reqs:
        ax.step(range(bins), tokens, where="post", label="tokens/s of completed requests")
    top = max(tokens + [1.0])
    marks = {"error": ("explicit error", "orange", "x"), "lost": ("lost", "red", "X"),
             "wrong_tokens": ("wrong token count", "purple", "d")}
    for outcome, (label, color, marker) in marks.items():
        xs = [r["done_s"] for r in reqs if r["outcome"] == outcome]
        if xs:
            ax.scatter(xs, [top * 0.05] * len(xs), color=color, marker=marker, label=label, zorder=3)
    for i, f in enumerate(rep["faults"]):
        if f["fired_s"] < 0:
            continue
        color = "red" if f["kind"] == "kill" else "darkorange"
        for a in (ax, ax2):
            a.axvline(f["fired_s"], color=color, linestyle="--")
            if f["recovered_after_s"] is not None:
                a.axvspan(f["fired_s"], f["fired_s"] + f["recovered_after_s"], color=color, alpha=0.12)
        ax.text(f["fired_s"], top * 1.02, f"{f['kind']} {f['target']}", rotation=90, va="bottom",
                ha="right", fontsize=7, color=color)
    ax.set_ylabel("tokens/s")
    ax.set_ylim(0, top * 1.35)
    inv = rep["invariants"]
    broken = [k for k, v in inv.items() if not v["ok"]]
    verdict = "all invariants hold" if not broken else "BROKEN: " + ", ".join(broken)
    if rep.get("target") == "cluster":
        ax.set_title("weft chaos: cluster at %s — %s" % (rep["url"], verdict))
        ax.text(0.5, 0.5, "workload: %s (exit %s)" % (rep["load"].get("workload") or "none",
                                                     rep["load"].get("workload_exit_status")),
                transform=ax.transAxes, ha="center", fontsize=9)
    else:
        ax.set_title("weft chaos: %s, %.1f req/s — %s" % (rep["url"], rep["load"]["rate_rps"], verdict))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper right", fontsize=8)
    ts = [s["t_s"] for s in rep["timeline"]]
    ax2.step(ts, [s["serving"] for s in rep["timeline"]], where="post", color="green")
    ax2.set_ylabel("live nodes" if rep.get("target") == "cluster" else "serving")
    ax2.set_xlabel("seconds since the load started (dashed: fault; shaded: until recovered)")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=100)


if __name__ == "__main__":
    main()
