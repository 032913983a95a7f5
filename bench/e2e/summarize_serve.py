#!/usr/bin/env python3
"""Condenses `weft bench serve` result files (one per server, with every request) into one small
JSON to commit beside a doc: per server its command, goodput search and, per probe, the rate, SLO
attainment, TTFT/TPOT/E2E p50 and p90, output throughput and errors.

Usage: bench/e2e/summarize_serve.py RESULT.json [RESULT.json ...] -o SUMMARY.json [--note TEXT]
"""
import argparse
import json


def pick(d, keys):
    return {k: round(d[k], 2) for k in keys if isinstance(d.get(k), (int, float))}


def summarize(path):
    j = json.load(open(path))
    probes = []
    for r in j["runs"]:
        s = r["summary"]
        probes.append({
            "rate_rps": r["rate_rps"],
            "slo_attainment": s.get("slo_attainment"),
            "ttft_ms": pick(s.get("ttft_ms", {}), ("p50", "p90", "p99")),
            "tpot_ms": pick(s.get("tpot_ms", {}), ("p50", "p90", "p99")),
            "e2e_ms": pick(s.get("e2e_ms", {}), ("p50", "p90")),
            "output_throughput_tps": round(s.get("output_throughput_tps", 0.0), 2),
            "n_ok": s.get("n_ok"), "n_failed": s.get("n_failed"),
        })
    return {
        "label": j.get("label"), "file": path.split("/")[-1], "server": j.get("server"),
        "command_line": j.get("command_line"), "commit": j.get("commit"), "machine": j.get("machine"),
        "started_at": j.get("started_at"), "finished_at": j.get("finished_at"), "slo": j.get("slo"),
        "goodput": j.get("goodput"),
        "peak_output_throughput_tps": round(max(p["output_throughput_tps"] for p in probes), 2),
        "workload": {k: v for k, v in j["runs"][0].get("workload", {}).items() if k != "requests"},
        "probes": sorted(probes, key=lambda p: p["rate_rps"]),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--note", default=None)
    a = ap.parse_args()
    out = {"servers": [summarize(p) for p in a.results]}
    if a.note:
        out["note"] = a.note
    json.dump(out, open(a.output, "w"), indent=1)
    for s in out["servers"]:
        g = s["goodput"] or {}
        print("%s: goodput %s req/s (< %s), peak output %.1f tok/s" % (
            s["label"], g.get("goodput_rps"), g.get("upper_bound_rps"), s["peak_output_throughput_tps"]))


if __name__ == "__main__":
    main()
