"""Chaos: SIGKILL a prefix-cache shard during a prefix-heavy load run.

Every request must complete with exactly the output of a cold run (a killed shard costs misses,
never wrong or stale KV), no KV block may stay referenced afterwards, and the shard must come back
(empty) and serve again. Prints what the kill cost (pool hit tokens before and after).

Usage: test_cache_chaos.py --weft PATH/TO/weft      (exit 77 = skipped: no model)
"""
import concurrent.futures
import json
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
from weft_serve import WeftServer, parse_test_args, report_failures  # noqa: E402

PREFIXES = ["System %d: " % p + " ".join("rule%d_%d holds;" % (p, i) for i in range(40)) for p in range(4)]
PROMPTS = [pre + " Query %d." % q for pre in PREFIXES for q in range(4)]


def completion(url, prompt):
    import urllib.request
    body = json.dumps({"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            out = json.loads(r.read().decode())
            return out["choices"][0]["text"], out["usage"]["prompt_tokens_details"]["cached_tokens"], None
    except Exception as e:  # noqa: BLE001 - any failure is a test failure
        return None, 0, str(e)


def pool_hits(srv):
    return sum(v for (n, l), v in srv.metrics().items() if n == "weft_cache_hit_tokens_total" and ("source", "pool") in l)


def main():
    args, _ = parse_test_args()
    if args is None:
        return 77
    with WeftServer(args.weft, ["--workers", "1", "--no-prefix-cache"]) as ref:
        reference = [completion(ref.url, p)[0] for p in PROMPTS]
    failures = []
    with WeftServer(args.weft, ["--workers", "2", "--cache-shards", "2", "--segment-tokens", "32",
                                "--cache-mem-gb", "0.25", "--route", "round-robin"]) as srv:
        # Warm the pool: every prefix prefilled once.
        for p in PROMPTS[::4]:
            completion(srv.url, p)
        time.sleep(1.0)
        hits_before = pool_hits(srv)
        shards = srv.admin()["router"]["shards"]
        victim = max(shards, key=lambda s: s["segments"])
        done = [0]
        lock = threading.Lock()

        def run(p):
            r = completion(srv.url, p)
            with lock:
                done[0] += 1
            return r

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(run, p) for p in PROMPTS * 2]
            while done[0] < 4:
                time.sleep(0.02)
            os.kill(victim["pid"], signal.SIGKILL)
            killed_at = time.time()
            results = [f.result() for f in futures]
        print("killed %s (pid %d, %d segments) after 4 of %d requests; load finished %.1f s later" %
              (victim["name"], victim["pid"], victim["segments"], len(results), time.time() - killed_at))
        for i, (text, cached, err) in enumerate(results):
            if err is not None:
                failures.append("request %d failed: %s" % (i, err))
            elif text != reference[i % len(PROMPTS)]:
                failures.append("request %d differs from the cold run" % i)
        print("pool hit tokens during the run: %d" % (pool_hits(srv) - hits_before))
        if srv.metric_sum("weft_cache_shard_deaths_total") < 1:
            failures.append("the router did not notice the shard's death")
        used = srv.wait_kv_free()
        if used != 0:
            failures.append("%d KV blocks still referenced after the run" % used)
        # The supervisor restarts the shard (empty); the pool serves again.
        deadline = time.time() + 60
        while time.time() < deadline and len(srv.admin()["router"]["shards"]) < 2:
            time.sleep(0.2)
        if len(srv.admin()["router"]["shards"]) < 2:
            failures.append("the killed shard did not come back")
        else:
            print("shard back %.1f s after the kill" % (time.time() - killed_at))
            again = [completion(srv.url, p) for p in PROMPTS[:8]]
            for i, (text, _, err) in enumerate(again):
                if err is not None or text != reference[i]:
                    failures.append("after recovery request %d: %s" % (i, err or "differs"))
            # Keys the restarted shard took over are copied to it from where they were republished.
            m = srv.metrics()
            moves = {dict(lb).get("outcome"): v for (n, lb), v in m.items() if n == "weft_cache_key_moves_total"}
            print("segments moved to the restarted shard: %d copied, %d failed, %d pending" % (
                moves.get("copied", 0), moves.get("failed", 0), srv.metric_sum("weft_cache_pending_moves")))
    return report_failures(failures, srv)


if __name__ == "__main__":
    sys.exit(main())
