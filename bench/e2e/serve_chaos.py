#!/usr/bin/env python3
"""Chaos under load: SIGKILL worker processes of `weft serve` while `weft bench serve` drives an
open-loop load, and measure what the issue's targets name: lost requests (target 0), tokens
missing or duplicated (every request asks for exactly --max-tokens with ignore_eos, so a completed
stream must carry exactly that many), kill-to-first-resumed-token (target <= 3 s, from the
router's `weft_migration_resume_seconds` histogram), KV blocks still referenced after the run
(target 0), and how long the supervisor took to bring the killed worker back.

Colocated (`--workers 2`): the worker with the most requests in flight is killed, then again once
it is back. Disaggregated (`--prefill 1 --decode 1`): the decode worker, then the prefill worker.
The tests (`tests/chaos/serve/`) check token identity against an undisturbed run; this measures.

Usage: bench/e2e/serve_chaos.py [--weft build/release/apps/weft] [--topology colocated|disaggregated]
                                [--rate R] [-n 150] [--max-tokens 64] [--out bench/results/...json]
Writes JSON (default bench/results/serve-chaos-<topology>-<date>.json) and prints a summary; exit 1
when a target is missed.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
from weft_serve import WeftServer  # noqa: E402

RESUME_TARGET_S = 3.0


def workers(srv):
    return srv.admin()["router"]["workers"]


def wait_restarted(srv, victim, timeout_s=120):
    """Seconds until a new process (another pid) serves as the killed worker, or None on timeout.
    Until the router sees the death the dead worker is still listed, so the count is not enough."""
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        if any(w["name"] == victim["name"] and w["pid"] != victim["pid"] for w in workers(srv)):
            return time.time() - t0
        time.sleep(0.1)
    return None


def histogram(metrics, name):
    """(count, sum) of a Prometheus histogram."""
    count = sum(v for (n, _), v in metrics.items() if n == name + "_count")
    total = sum(v for (n, _), v in metrics.items() if n == name + "_sum")
    return count, total


def pick_victim(srv, role, min_inflight):
    """The worker of `role` (any if None) with the most requests in flight, once it has at least
    `min_inflight` (waits up to 30 s; then the busiest one anyway)."""
    deadline = time.time() + 30
    while True:
        ws = sorted((w for w in workers(srv) if role is None or w["role"] == role), key=lambda w: -w["inflight"])
        if ws and (ws[0]["inflight"] >= min_inflight or time.time() > deadline):
            return ws[0]
        time.sleep(0.05)


def plot(reqs, kills, args, path):
    """E2E latency of every request against its send time, with the kills marked (PNG)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot (scripts/setup.sh --bench installs it)")
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    ok = [r for r in reqs if r["status"] == "ok"]
    ax.scatter([r["scheduled_s"] for r in ok], [r["e2e_ms"] / 1e3 for r in ok], s=8, label="completed")
    bad = [r for r in reqs if r["status"] != "ok"]
    if bad:
        ax.scatter([r["scheduled_s"] for r in bad], [0] * len(bad), marker="x", color="red", label="lost")
    for i, k in enumerate(kills):
        # Kill times count from the load generator's start; its own clock starts a few ms later.
        ax.axvline(k["at_s"], color="red", linestyle="--", label="SIGKILL" if i == 0 else None)
    ax.set_xlabel("request sent at (s)")
    ax.set_ylabel("E2E latency (s)")
    ax.set_title("weft serve %s, %.1f req/s: workers killed under load" % (args.topology, args.rate))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print("wrote " + path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weft", default=os.path.join(ROOT, "build", "release", "apps", "weft"))
    ap.add_argument("--topology", choices=["colocated", "disaggregated"], default="colocated")
    ap.add_argument("--rate", type=float, default=None,
                    help="offered load, req/s (Poisson); default 3 colocated, 1.5 disaggregated (one prefill thread)")
    ap.add_argument("-n", "--num-requests", type=int, default=150)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--first-kill-s", type=float, default=8.0, help="first kill this long after the load starts")
    ap.add_argument("--out", default=None)
    ap.add_argument("--server-log", default=None, help="also write the server's log here")
    ap.add_argument("--cache-shards", type=int, default=0,
                    help="prefix-cache pool shards (colocated): running sequences checkpoint their KV there and "
                         "migrated ones resume from it (0 = no pool)")
    ap.add_argument("--segment-tokens", type=int, default=16, help="pool segment size (with --cache-shards)")
    ap.add_argument("--no-pool-generated", action="store_true",
                    help="with --cache-shards: pool prompt segments only (no checkpoints of generated tokens)")
    args = ap.parse_args()
    if args.rate is None:
        args.rate = 3.0 if args.topology == "colocated" else 1.5

    if args.topology == "colocated":
        topology, victims = ["--workers", "2"], [None, None]
    else:
        topology, victims = ["--prefill", "1", "--decode", "1"], ["decode", "prefill"]
    if args.cache_shards > 0:
        topology += ["--cache-shards", str(args.cache_shards), "--segment-tokens", str(args.segment_tokens)]
        if args.no_pool_generated:
            topology.append("--no-pool-generated")
    day = time.strftime("%Y%m%d-%H%M")
    out = args.out or os.path.join(ROOT, "bench", "results", "serve-chaos-%s-%s.json" % (args.topology, day))
    os.makedirs(os.path.dirname(out), exist_ok=True)

    kills = []
    with WeftServer(args.weft, topology + ["--max-running", "16"]) as srv, \
            tempfile.TemporaryDirectory() as tmp:
        load_json = os.path.join(tmp, "load.json")
        load = subprocess.Popen(
            [args.weft, "bench", "serve", "--url", srv.url, "-n", str(args.num_requests), "--rate", str(args.rate),
             "--seed", "1", "--prompt-tokens", str(args.prompt_tokens), "--output-tokens", str(args.max_tokens),
             "--label", "chaos-" + args.topology, "--out", load_json],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        log = []
        threading.Thread(target=lambda: log.extend(load.stdout), daemon=True).start()
        started = time.time()
        time.sleep(args.first_kill_s)
        for role in victims:
            if load.poll() is not None:
                break
            victim = pick_victim(srv, role, 4 if role == "decode" else 1)
            os.kill(victim["pid"], signal.SIGKILL)
            killed_at = time.time()
            back_s = wait_restarted(srv, victim)
            kills.append({"worker": victim["name"], "role": victim["role"], "pid": victim["pid"],
                          "inflight": victim["inflight"], "at_s": round(killed_at - started, 2),
                          "restarted_after_s": back_s})
            print("killed %s (%s, pid %d, %d in flight) at %.1f s; back after %s s" %
                  (victim["name"], victim["role"], victim["pid"], victim["inflight"], killed_at - started,
                   "%.1f" % back_s if back_s is not None else "never"))
            time.sleep(2.0)
        load.wait()
        if load.returncode != 0:
            sys.stderr.write("".join(log[-30:]))
            print("weft bench serve failed (exit %d)" % load.returncode)
            return 1
        kv_used = srv.wait_kv_free()
        metrics = srv.metrics()
        # The router logs every resume with its exact time (the histogram has 2.5 s / 5 s buckets).
        # Each line also says how many tokens the sequence had streamed before its worker died
        # (0: it was still queued there, so its "resume" is its first token).
        resumes = [(float(m.group(1)), int(m.group(2))) for line in list(srv.log_lines)
                   for m in [re.search(r"resumed on \S+ (\d+) ms after its worker died \((\d+) tokens", line)]
                   if m]
        resumes_ms = [ms for ms, _ in resumes]
        # Each worker logs what a resumed sequence took from the pool and what it recomputes.
        pooled = [(int(m.group(1)), int(m.group(2))) for line in list(srv.log_lines)
                  for m in [re.search(r"resumed request \d+ \(.*\): (\d+) of its (\d+) tokens' KV from the pool",
                                      line)] if m]
        run = json.load(open(load_json))["runs"][0]
        if args.server_log:
            with open(args.server_log, "w") as f:
                f.writelines(list(srv.log_lines))

    reqs = run["requests"]
    ok = [r for r in reqs if r["status"] == "ok"]
    lost = [r for r in reqs if r["status"] != "ok"]
    wrong_length = [r for r in ok if r["completion_tokens"] != r["max_tokens"]]
    migrations = sum(v for (n, _), v in metrics.items() if n == "weft_router_migrations_total")
    n_resumed, resume_sum = histogram(metrics, "weft_migration_resume_seconds")
    resumes_ms.sort()
    # Every observation of the histogram has its log line; a mismatch means the max is unknown.
    complete = n_resumed > 0 and len(resumes_ms) == n_resumed
    resume_max = resumes_ms[-1] / 1e3 if complete else None
    result = {
        "benchmark": "serve_chaos", "topology": args.topology, "rate_rps": args.rate,
        "num_requests": len(reqs), "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
        "kills": kills, "completed": len(ok), "lost": len(lost),
        "lost_detail": [{"index": r["index"], "status": r["status"], "http_status": r.get("http_status")} for r in lost],
        "wrong_token_count": len(wrong_length), "migrations": migrations,
        "resumed_sequences": n_resumed,
        "resume_mean_s": resume_sum / n_resumed if n_resumed else None,
        "resume_max_s": resume_max,
        "resume_p50_s": resumes_ms[len(resumes_ms) // 2] / 1e3 if resumes_ms else None,
        "resumes_logged": len(resumes_ms),
        # Split by what the sequence had before the kill: streaming (>= 1 token) or still queued.
        "resume_streaming_max_s": max((ms for ms, k in resumes if k > 0), default=0) / 1e3 if resumes else None,
        "resume_queued_max_s": max((ms for ms, k in resumes if k == 0), default=0) / 1e3 if resumes else None,
        "resumes": [{"ms": ms, "tokens_before": k} for ms, k in sorted(resumes)],
        "cache_shards": args.cache_shards,
        "segment_tokens": args.segment_tokens if args.cache_shards else None,
        "pool_generated": bool(args.cache_shards) and not args.no_pool_generated,
        "resumed_from_pool": len(pooled),
        "resume_tokens_from_pool": sum(p for p, _ in pooled),
        "resume_tokens_total_of_those": sum(t for _, t in pooled),
        "kv_blocks_used_after": kv_used, "e2e_ms": run["summary"]["e2e_ms"], "ttft_ms": run["summary"]["ttft_ms"],
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    json.dump(result, open(out, "w"), indent=2)
    plot(reqs, kills, args, out[:-len(".json")] + ".png" if out.endswith(".json") else out + ".png")
    print("%s: %d requests at %.1f req/s, %d kills: completed %d, lost %d, wrong token count %d, "
          "migrations %d, KV blocks used after %s" %
          (args.topology, len(reqs), args.rate, len(kills), len(ok), len(lost), len(wrong_length), migrations, kv_used))
    if pooled:
        print("resumed from the pool: %d sequences took %d of their %d tokens' KV from it" %
              (len(pooled), result["resume_tokens_from_pool"], result["resume_tokens_total_of_those"]))
    if complete:
        print("kill-to-first-resumed-token: mean %.3f s over %d sequences, max %.3f s; target <= %.0f s"
              % (resume_sum / n_resumed, n_resumed, resume_max, RESUME_TARGET_S))
        print("  streaming at the kill: %d, max %.3f s; still queued there: %d, max %.3f s" %
              (sum(1 for _, k in resumes if k > 0), result["resume_streaming_max_s"],
               sum(1 for _, k in resumes if k == 0), result["resume_queued_max_s"]))
    else:
        print("kill-to-first-resumed-token: %d in the metric, %d in the log: max unknown" % (n_resumed, len(resumes_ms)))
    print("wrote " + out)
    missed = lost or wrong_length or kv_used != 0 or len(kills) < len(victims) or not complete \
        or resume_max > RESUME_TARGET_S or any(k["restarted_after_s"] is None for k in kills)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
