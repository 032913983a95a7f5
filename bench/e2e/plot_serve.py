#!/usr/bin/env python3
"""Plots `weft bench serve` results: SLO attainment vs request rate, and TTFT / E2E latency CDFs.

usage: plot_serve.py RESULT.json [RESULT.json ...] -o OUT.png

Each JSON file is one series, labelled with its "label". The attainment panel has one point per run
(rate); the CDF panels use the run at the highest rate that met the attainment target (the goodput
run), else the last run. Exit status 3 means matplotlib is missing.
"""

import argparse
import json
import sys


def load(path):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if doc.get("benchmark") != "serve" or "runs" not in doc:
        raise ValueError(f"{path} is not a `weft bench serve` result")
    return doc


def cdf_run(doc):
    runs = [r for r in doc["runs"] if r.get("requests")]
    if not runs:
        return None
    target = (doc.get("slo") or {}).get("attainment_target") or 0.9
    passing = [r for r in runs if (r["summary"].get("slo_attainment") or 0) >= target]
    return max(passing, key=lambda r: r["rate_rps"]) if passing else runs[-1]


def cdf(values):
    xs = sorted(values)
    n = len(xs)
    return xs, [(i + 1) / n for i in range(n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="JSON files written by `weft bench serve`")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    args = ap.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError as e:
        print(f"plot_serve.py: matplotlib is missing ({e}); install python3-matplotlib or `pip install matplotlib`",
              file=sys.stderr)
        return 3
    try:
        docs = [load(p) for p in args.results]
    except (OSError, ValueError, KeyError) as e:
        print(f"plot_serve.py: {e}", file=sys.stderr)
        return 1

    fig, (ax_att, ax_ttft, ax_e2e) = plt.subplots(1, 3, figsize=(16, 4.8))
    any_attainment = False
    for doc in docs:
        label = doc.get("label", "?")
        pts = sorted((r["rate_rps"], r["summary"]["slo_attainment"]) for r in doc["runs"]
                     if r["summary"].get("slo_attainment") is not None)
        if pts:
            any_attainment = True
            ax_att.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker="o", label=label)
        g = doc.get("goodput")
        if g and g.get("goodput_rps"):
            ax_att.axvline(g["goodput_rps"], linestyle=":", alpha=0.6)
        run = cdf_run(doc)
        if run is None:
            continue
        ok = [r for r in run["requests"] if r["status"] == "ok"]
        series = f"{label} @ {run['rate_rps']:.2f} req/s"
        for ax, key in ((ax_ttft, "ttft_ms"), (ax_e2e, "e2e_ms")):
            vals = [r[key] for r in ok if r.get(key) is not None]
            if vals:
                xs, ys = cdf(vals)
                ax.step(xs, ys, where="post", label=series)

    slo = (docs[0].get("slo") or {})
    target = slo.get("attainment_target") or 0.9
    ax_att.axhline(100 * target, color="grey", linestyle="--", linewidth=1)
    ax_att.set_xlabel("request rate (req/s)")
    ax_att.set_ylabel("SLO attainment (%)")
    ax_att.set_ylim(0, 105)
    title = "SLO attainment"
    parts = [f"TTFT ≤ {slo['ttft_ms']:g} ms" if slo.get("ttft_ms") else None,
             f"TPOT ≤ {slo['tpot_ms']:g} ms" if slo.get("tpot_ms") else None]
    parts = [p for p in parts if p]
    ax_att.set_title(title + (" (" + ", ".join(parts) + ")" if parts else " (no SLO set)"))
    if not any_attainment:
        ax_att.text(0.5, 0.5, "no SLO given (--ttft-slo-ms / --tpot-slo-ms)", ha="center", va="center",
                    transform=ax_att.transAxes)
    ax_ttft.set_title("TTFT CDF")
    ax_ttft.set_xlabel("TTFT (ms)")
    ax_e2e.set_title("E2E latency CDF")
    ax_e2e.set_xlabel("E2E latency (ms)")
    for ax in (ax_ttft, ax_e2e):
        ax.set_ylabel("fraction of requests")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(True, alpha=0.3)
    ax_att.grid(True, alpha=0.3)
    for ax in (ax_att, ax_ttft, ax_e2e):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    machine = docs[0].get("machine", {})
    fig.suptitle(f"weft bench serve — {machine.get('cpu_model', '?')}, {machine.get('nproc', '?')} CPUs, "
                 f"commit {docs[0].get('commit', '?')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
