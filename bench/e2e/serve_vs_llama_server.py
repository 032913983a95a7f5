#!/usr/bin/env python3
"""Peak serving throughput, weft vs llama.cpp's own `llama-server` with parallel slots (continuous
batching), the strongest single-node CPU baseline users pick. Closed loop: C clients each send
streaming greedy completions one after another (fixed prompt, `max_tokens` new tokens,
`ignore_eos`), for `--seconds`; reports output tokens/s, mean and p90 end-to-end latency and mean
TTFT for each server, alternating servers over `--repeat` rounds, and their ratio (medians).

    bench/e2e/serve_vs_llama_server.py [--weft build/release/apps/weft]
        [--llama-server ~/.cache/weft/llama-server-0.3.16/llama-server] [--clients 16]
        [--tokens 64] [--seconds 40] [--repeat 2] [--threads $(nproc)] [--out F.json]
        [--weft-base OLD/apps/weft [--weft-base-args '--flag value']]
        [--servers weft,weft-base,llama-server]

`--weft-base` adds a second weft build (another commit) to the same alternation, for before/after
figures of a change (`--weft-base-args` gives it extra flags: the same binary with a flag changed); `--servers` picks which of the three run (default: weft and llama-server,
plus weft-base when given).

llama-server runs with `-np C -t threads -c C*ctx` (one slot per client, the same context per
sequence as weft's `--ctx-size`); weft with its defaults (`weft serve`, one engine worker per
core). `scripts/build_llama_server.sh` builds llama-server from the llama.cpp source vendored in
the llama-cpp-python sdist weft's tests pin (`scripts/setup.sh --bench` runs it).
"""
import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "support"))
from weft_serve import default_model_path  # noqa: E402

PROMPT = ("Write a short story about a lighthouse keeper who finds a message in a bottle. "
          "Describe the sea, the weather and the keeper's thoughts.")


def wait_ready(url, proc, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            time.sleep(0.5)
    raise RuntimeError(f"{url} did not come up")


@contextlib.contextmanager
def running(cmd, url, log_path):
    """The server `cmd` started, ready at `url` (its output in log_path), stopped on exit."""
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(url, proc)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def warm_up(request):
    """Runs `request` until it succeeds: llama-server answers /v1/models before its model is
    loaded and 503 to requests until then (60 s at most)."""
    for attempt in range(120):
        try:
            return request()
        except urllib.error.HTTPError as e:
            if e.code != 503 or attempt == 119:
                raise
            time.sleep(0.5)


def one_request(url, tokens):
    body = {"prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    t0 = time.perf_counter()
    ttft, n = None, 0
    with urllib.request.urlopen(req, timeout=300) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                if ttft is None:
                    ttft = time.perf_counter() - t0
                n += 1
            usage = chunk.get("usage") or {}
            if usage.get("completion_tokens"):
                n = usage["completion_tokens"]
    return time.perf_counter() - t0, ttft or 0.0, n


def closed_loop(url, clients, tokens, seconds):
    """`clients` threads sending back to back for `seconds`; completed requests only."""
    stop = time.time() + seconds
    lock = threading.Lock()
    done = []

    def worker():
        while time.time() < stop:
            e2e, ttft, n = one_request(url, tokens)
            with lock:
                done.append((time.time(), e2e, ttft, n))

    warm_up(lambda: one_request(url, 4))
    t0 = time.time()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t0
    toks = sum(d[3] for d in done)
    e2es = sorted(d[1] for d in done)
    return {"requests": len(done), "output_tokens": toks, "wall_s": wall,
            "output_tokens_per_s": toks / wall, "e2e_mean_s": statistics.mean(e2es),
            "e2e_p90_s": e2es[int(0.9 * (len(e2es) - 1))],
            "ttft_mean_s": statistics.mean(d[2] for d in done),
            "tokens_per_request": toks / max(1, len(done))}


def main():
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", default=os.path.join(root, "build", "release", "apps", "weft"))
    ap.add_argument("--llama-server", default=os.path.expanduser(
        "~/.cache/weft/llama-server-0.3.16/llama-server"))
    ap.add_argument("--model", default=default_model_path())
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--ctx", type=int, default=1024, help="context per sequence, both servers")
    ap.add_argument("--out", default=os.path.join(root, "bench", "results", "serve-vs-llama-server.json"))
    ap.add_argument("--weft-base", help="another weft binary (e.g. the commit before a change)")
    ap.add_argument("--weft-base-args", default="",
                    help="extra `weft serve` flags for weft-base, space-separated (A/B of a flag "
                         "on one binary: --weft-base build/release/apps/weft --weft-base-args "
                         "'--helper-sched normal')")
    ap.add_argument("--servers", help="comma-separated subset of weft,weft-base,llama-server")
    a = ap.parse_args()
    all_servers = {
        "llama-server": [a.llama_server, "-m", a.model, "--port", "8396", "-np", str(a.clients),
                         "-t", str(a.threads), "-c", str(a.clients * a.ctx), "--no-webui"],
        "weft": [a.weft, "serve", "--model", a.model, "--port", "8397", "--ctx-size", str(a.ctx)],
    }
    if a.weft_base:
        all_servers["weft-base"] = [a.weft_base, "serve", "--model", a.model, "--port", "8398",
                                    "--ctx-size", str(a.ctx)] + a.weft_base_args.split()
    chosen = a.servers.split(",") if a.servers else list(all_servers)
    unknown = [x for x in chosen if x not in all_servers]
    if unknown:
        ap.error(f"unknown or unavailable servers {unknown} (weft-base needs --weft-base)")
    servers = {k: v for k, v in all_servers.items() if k in chosen}
    if "llama-server" in servers and not os.path.exists(a.llama_server):
        print(f"no llama-server at {a.llama_server} (scripts/build_llama_server.sh)")
        return 2
    urls = {"llama-server": "http://127.0.0.1:8396", "weft": "http://127.0.0.1:8397",
            "weft-base": "http://127.0.0.1:8398"}
    runs = {k: [] for k in servers}
    for r in range(a.repeat):
        for name, cmd in servers.items():
            with running(cmd, urls[name], f"/tmp/serve-vs-llama-server-{name}.log"):
                res = closed_loop(urls[name], a.clients, a.tokens, a.seconds)
            runs[name].append(res)
            print(f"round {r + 1} {name}: {res['output_tokens_per_s']:.1f} output tok/s, "
                  f"E2E mean {res['e2e_mean_s']:.2f} s (p90 {res['e2e_p90_s']:.2f} s), "
                  f"TTFT mean {res['ttft_mean_s']:.2f} s, {res['requests']} requests", flush=True)
    med = {k: statistics.median(x["output_tokens_per_s"] for x in v) for k, v in runs.items()}
    summary = {"model": a.model, "clients": a.clients, "tokens": a.tokens, "seconds": a.seconds,
               "threads": a.threads, "ctx_per_sequence": a.ctx, "commands": servers,
               "median_output_tokens_per_s": med, "runs": runs}
    if "weft" in med and "llama-server" in med:
        summary["ratio_weft_over_llama_server"] = med["weft"] / med["llama-server"]
    if "weft" in med and "weft-base" in med:
        summary["ratio_weft_over_weft_base"] = med["weft"] / med["weft-base"]
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    json.dump(summary, open(a.out, "w"), indent=1)
    ratios = ", ".join(f"{k} {v:.2f}x" for k, v in summary.items() if k.startswith("ratio_"))
    print("median output tok/s: " + ", ".join(f"{k} {v:.1f}" for k, v in med.items()) +
          (f" -> {ratios}" if ratios else "") + f" ({a.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
