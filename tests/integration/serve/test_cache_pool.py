"""Prefix-cache pool (TokenLake): `weft serve --workers 2 --cache-shards 2`.

A prompt prefilled on worker A is published to the shards; the same prefix sent to worker B is
fetched from the pool over UCX and must give exactly the output of a cold run (greedy and seeded
sampling, with log-probabilities), with `usage.prompt_tokens_details.cached_tokens` counting the
pooled tokens. Round-robin routing makes the two workers alternate deterministically.

Usage: test_cache_pool.py --weft PATH/TO/weft     (exit 77 = skipped: no model)
"""
import json
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
from weft_serve import WeftServer, parse_test_args  # noqa: E402

WEFT = None
SERVER = None
COLD = {}
SEGMENT = 32
PREFIX = "You are a careful assistant. " + " ".join("fact%d is %d;" % (i, i * 3) for i in range(60))
BODIES = {
    "greedy_a": {"prompt": PREFIX + " Question A: what is fact7?", "max_tokens": 12, "temperature": 0},
    "greedy_b": {"prompt": PREFIX + " Question B: what is fact9?", "max_tokens": 12, "temperature": 0},
    "sampled_c": {"prompt": PREFIX + " Question C: pick a fact.", "max_tokens": 16, "temperature": 0.9,
                  "seed": 21, "logprobs": 2, "ignore_eos": True},
}


def completion(srv, body):
    status, text = srv.request("POST", "/v1/completions", body)
    assert status == 200, text
    out = json.loads(text)
    c = out["choices"][0]
    return (c["text"], c["finish_reason"], (c.get("logprobs") or {}).get("token_logprobs")), out["usage"]


def pool_hits(srv):
    return sum(v for (n, l), v in srv.metrics().items() if n == "weft_cache_hit_tokens_total" and ("source", "pool") in l)


def wait_pool_hits(srv, at_least, timeout_s=10):
    """The router's counters come from the workers' load reports (every 200 ms): a request's pooled
    tokens show up a report after its response."""
    deadline = time.time() + timeout_s
    while time.time() < deadline and pool_hits(srv) < at_least:
        time.sleep(0.1)
    return pool_hits(srv)


def wait_segments(srv, at_least, timeout_s=20):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        n = sum(s["segments"] for s in srv.admin()["router"]["shards"])
        if n >= at_least:
            return n
        time.sleep(0.2)
    return sum(s["segments"] for s in srv.admin()["router"]["shards"])


class CachePoolTest(unittest.TestCase):
    def test_1_prefix_from_the_pool_on_another_worker_equals_a_cold_run(self):
        shards = SERVER.admin()["router"]["shards"]
        self.assertEqual(len(shards), 2)
        # Worker A (round-robin turn 0) prefills cold and publishes the prefix's segments.
        got, usage = completion(SERVER, BODIES["greedy_a"])
        self.assertEqual(got, COLD["greedy_a"])
        self.assertEqual(usage["prompt_tokens_details"]["cached_tokens"], 0)
        n_segments = usage["prompt_tokens"] // SEGMENT
        self.assertGreaterEqual(wait_segments(SERVER, n_segments - 1), n_segments - 1)
        before = pool_hits(SERVER)
        # Worker B (turn 1) has nothing local: the shared prefix comes from the pool.
        got, usage = completion(SERVER, BODIES["greedy_b"])
        self.assertEqual(got, COLD["greedy_b"])
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        self.assertGreater(cached, 0)
        self.assertEqual(cached % SEGMENT, 0, "pooled tokens come in whole segments")
        self.assertEqual(wait_pool_hits(SERVER, before + cached) - before, cached)
        # Seeded sampling with log-probs is unchanged too (turn 2 = worker A again: local hit;
        # turn 3 = worker B: local or pool); both must equal the cold run.
        for _ in range(2):
            got, usage = completion(SERVER, BODIES["sampled_c"])
            self.assertEqual(got, COLD["sampled_c"])
            self.assertGreater(usage["prompt_tokens_details"]["cached_tokens"], 0)

    def test_2_metrics_and_status(self):
        completion(SERVER, BODIES["greedy_a"])
        m = SERVER.metrics()
        names = {n for n, _ in m}
        for n in ("weft_cache_segments", "weft_cache_bytes_used", "weft_cache_hit_tokens_total", "weft_cache_shard_imbalance",
                  "weft_cache_shard_lookups_total", "weft_cache_pool_bytes_in_total"):
            self.assertIn(n, names)
        shards = SERVER.admin()["router"]["shards"]
        self.assertTrue(all(s["capacity_bytes"] > 0 for s in shards))
        self.assertEqual(SERVER.wait_kv_free(), 0)


def metric(srv, name, **labels):
    want = set(labels.items())
    return sum(v for (n, l), v in srv.metrics().items() if n == name and want <= set(l))


class HotSegmentReplicaTest(unittest.TestCase):
    """Local reuse off: every request reads its prefix from the pool. Once the prefix is hot the
    directory copies its segments to a second shard and spreads reads over both; outputs and
    pooled token counts must not change."""

    def test_hot_prefix_is_replicated_and_replicas_serve_identical_kv(self):
        with WeftServer(WEFT, ["--workers", "1", "--cache-shards", "2", "--segment-tokens", str(SEGMENT),
                               "--cache-mem-gb", "0.25", "--cache-replicas", "2", "--no-prefix-cache"]) as srv:
            got, usage = completion(srv, BODIES["greedy_a"])
            self.assertEqual(got, COLD["greedy_a"])
            n_segments = (usage["prompt_tokens"] - 2) // SEGMENT
            self.assertGreaterEqual(wait_segments(srv, n_segments), n_segments)
            pooled = None
            for _ in range(20):
                got, usage = completion(srv, BODIES["greedy_a"])
                self.assertEqual(got, COLD["greedy_a"])
                pooled = pooled or usage["prompt_tokens_details"]["cached_tokens"]
                self.assertEqual(usage["prompt_tokens_details"]["cached_tokens"], pooled)
            self.assertEqual(pooled, n_segments * SEGMENT)
            deadline = time.time() + 20
            while time.time() < deadline and metric(srv, "weft_cache_replicated_keys") < n_segments:
                completion(srv, BODIES["greedy_a"])
                time.sleep(0.2)
            self.assertEqual(metric(srv, "weft_cache_replicated_keys"), n_segments)
            self.assertGreaterEqual(metric(srv, "weft_cache_replications_total", outcome="copied"), n_segments)
            self.assertGreater(metric(srv, "weft_cache_hot_segments"), 0)
            # Reads now alternate between the home and the replica of every segment.
            lookups = {s["name"]: s["lookups"] for s in srv.admin()["router"]["shards"]}
            for _ in range(6):
                got, usage = completion(srv, BODIES["greedy_a"])
                self.assertEqual(got, COLD["greedy_a"])
                self.assertEqual(usage["prompt_tokens_details"]["cached_tokens"], pooled)
            time.sleep(1.0)  # shard load reports
            after = {s["name"]: s["lookups"] for s in srv.admin()["router"]["shards"]}
            for name in lookups:
                self.assertGreaterEqual(after[name] - lookups[name], 6 * n_segments // 2 - 1, name)
            self.assertEqual(srv.wait_kv_free(), 0)


def main():
    global WEFT, SERVER
    args, rest = parse_test_args()
    if args is None:
        return 77
    WEFT = args.weft
    with WeftServer(WEFT, ["--workers", "1", "--no-prefix-cache"]) as ref:
        for name, body in BODIES.items():
            COLD[name] = completion(ref, body)[0]
    with WeftServer(WEFT, ["--workers", "2", "--cache-shards", "2", "--segment-tokens", str(SEGMENT),
                           "--cache-mem-gb", "0.25", "--route", "round-robin"]) as srv:
        SERVER = srv
        prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
        if not prog.result.wasSuccessful():
            sys.stderr.write("".join(srv.log_lines[-60:]))
        return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
