#!/usr/bin/env python3
"""Cold prefill of long prompts through the server, weft vs llama.cpp's `llama-server`: one request
at a time, each a prompt no earlier request shares (a different random word list, so neither prefix
cache helps), `max_tokens` 1, non-streaming. The request's wall time is its time to first token;
prefill tok/s = the prompt tokens the server reports / that time. Servers alternate per round; the
figure per length is the median over rounds.

    bench/e2e/serve_long_prompt.py [--lengths 1024,2048,4096,8000] [--repeat 2]
        [--threads $(nproc)] [--weft-args "..."] [--out F.json]

llama-server runs with `-np 1 -t threads -c ctx` and `cache_prompt: false` per request; weft with
`weft serve --workers 1 --ctx-size ctx` plus `--weft-args`.
"""
import argparse
import json
import os
import random
import statistics
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "support"))
from serve_vs_llama_server import running, warm_up  # noqa: E402
from weft_serve import default_model_path  # noqa: E402

WORDS = ("river stone light morning window garden letter market winter summer bridge village "
         "mountain ocean forest table candle story music silver copper engine harbor lantern "
         "meadow orchard thunder valley shadow paper pocket ribbon saddle tunnel velvet whistle").split()


def prompt_of(n_words, seed):
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def one(url, prompt):
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0, "cache_prompt": False}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=900) as r:
        out = json.loads(r.read())
    wall = time.perf_counter() - t0
    return wall, int(out["usage"]["prompt_tokens"])


def main():
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weft", default=os.path.join(root, "build", "release", "apps", "weft"))
    ap.add_argument("--llama-server", default=os.path.expanduser(
        "~/.cache/weft/llama-server-0.3.16/llama-server"))
    ap.add_argument("--model", default=default_model_path())
    ap.add_argument("--lengths", default="1024,2048,4096,8000",
                    help="prompt lengths in tokens (one word a token; the server reports the exact count)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--weft-args", default="", help="extra `weft serve` flags")
    ap.add_argument("--out", default=os.path.join(root, "bench", "results",
                                                  "serve-long-prompt.json"))
    a = ap.parse_args()
    if not os.path.exists(a.llama_server):
        print(f"no llama-server at {a.llama_server} (scripts/build_llama_server.sh)")
        return 2
    lengths = [int(x) for x in a.lengths.split(",")]
    ctx = max(lengths) + 64  # SmolLM2's own context is 8192: weft refuses a larger --ctx-size
    servers = {
        "llama-server": [a.llama_server, "-m", a.model, "--port", "8398", "-np", "1",
                         "-t", str(a.threads), "-c", str(ctx), "--no-webui"],
        "weft": [a.weft, "serve", "--model", a.model, "--port", "8399", "--workers", "1",
                 "--ctx-size", str(ctx)] + a.weft_args.split(),
    }
    urls = {"llama-server": "http://127.0.0.1:8398", "weft": "http://127.0.0.1:8399"}
    runs = {k: {str(n): [] for n in lengths} for k in servers}
    for r in range(a.repeat):
        for name, cmd in servers.items():
            with running(cmd, urls[name], f"/tmp/serve-long-prompt-{name}.log"):
                warm_up(lambda: one(urls[name], prompt_of(16, 10**6 + r)))
                for n in lengths:
                    # Each of these words is one token (a space and the word).
                    wall, tokens = one(urls[name], prompt_of(n, 1000 * r + n))
                    runs[name][str(n)].append({"prompt_tokens": tokens, "seconds": wall,
                                               "prefill_tok_s": tokens / wall})
                    print(f"round {r + 1} {name}: {tokens} prompt tokens in {wall:.2f} s "
                          f"({tokens / wall:.0f} tok/s)", flush=True)
    summary = {"model": a.model, "threads": a.threads, "ctx": ctx, "commands": servers,
               "lengths": {}, "runs": runs}
    for n in lengths:
        med = {k: statistics.median(x["prefill_tok_s"] for x in runs[k][str(n)]) for k in servers}
        summary["lengths"][str(n)] = {
            "prompt_tokens": runs["weft"][str(n)][0]["prompt_tokens"],
            "median_prefill_tok_s": med,
            "ratio_weft_over_llama_server": med["weft"] / med["llama-server"]}
        print(f"{n:>6} tokens: weft {med['weft']:.0f} tok/s, llama-server "
              f"{med['llama-server']:.0f} tok/s -> {med['weft'] / med['llama-server']:.2f}x")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    json.dump(summary, open(a.out, "w"), indent=1)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
