"""`weft serve --prefill 1 --decode 1` (DistServe-style disaggregation) against colocated serving.

The decode worker pulls each prompt's KV from the prefill worker over UCX under a lease: outputs
(greedy and seeded sampling, with log-probabilities) must equal a colocated server's, every handoff
must be counted, and no KV block may stay referenced on either worker afterwards, also when a
client disconnects mid-stream.

Usage: test_disaggregated.py --weft PATH/TO/weft     (exit 77 = skipped: no model)
"""
import concurrent.futures
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
from weft_serve import WeftServer, parse_test_args  # noqa: E402

WEFT = None
SERVER = None
REFERENCE = {}

LONG_PROMPT = " ".join("word%d" % i for i in range(150))  # several KV blocks
CASES = [
    # (name, request body)
    ("greedy", {"prompt": "The capital of France is", "max_tokens": 24, "temperature": 0}),
    ("greedy_long", {"prompt": LONG_PROMPT, "max_tokens": 16, "temperature": 0, "ignore_eos": True}),
    ("sampled", {"prompt": "Once upon a time,", "max_tokens": 32, "temperature": 0.9, "top_p": 0.95,
                 "seed": 11, "logprobs": 2, "ignore_eos": True}),
    ("penalties", {"prompt": "List the numbers:", "max_tokens": 24, "temperature": 0.7, "seed": 3,
                   "presence_penalty": 0.8, "frequency_penalty": 0.5, "ignore_eos": True}),
    ("n2_stop", {"prompt": "Count: 1, 2, 3,", "max_tokens": 40, "temperature": 0.8, "seed": 5, "n": 2,
                 "stop": [" 9"]}),
    ("one_token", {"prompt": "Hello", "max_tokens": 1, "temperature": 0}),
]


def completion(srv, body):
    status, text = srv.request("POST", "/v1/completions", body)
    assert status == 200, text
    out = json.loads(text)
    return [(c["text"], c["finish_reason"], (c.get("logprobs") or {}).get("token_logprobs")) for c in out["choices"]]


class DisaggregatedTest(unittest.TestCase):
    def test_outputs_equal_colocated(self):
        for name, body in CASES:
            got = completion(SERVER, body)
            self.assertEqual(got, REFERENCE[name], name)

    def test_roles_and_handoff_metrics(self):
        roles = sorted(w["role"] for w in SERVER.admin()["router"]["workers"])
        self.assertEqual(roles, ["decode", "prefill"])
        before = SERVER.metric_sum("weft_kv_handoffs_total")
        completion(SERVER, {"prompt": "Tell me about the sea.", "max_tokens": 8, "temperature": 0, "ignore_eos": True})
        m = SERVER.metrics()
        ok = sum(v for (n, l), v in m.items() if n == "weft_kv_handoffs_total" and ("outcome", "ok") in l)
        self.assertGreaterEqual(ok, before + 1)
        self.assertGreater(SERVER.metric_sum("weft_kv_transfer_bytes_total"), 0)
        self.assertGreater(SERVER.metric_sum("weft_kv_transfer_seconds_count"), 0)
        self.assertEqual(SERVER.metric_sum("weft_kv_leases_expired_total"), 0)
        # The decode worker decoded; the prefill worker only prefilled (and sampled first tokens).
        ws = {w["role"]: w for w in SERVER.admin()["router"]["workers"]}
        self.assertGreater(ws["decode"]["decode_tokens"], 0)
        self.assertGreater(ws["prefill"]["prefill_tokens"], 0)
        self.assertEqual(SERVER.wait_kv_free(), 0)

    def test_cluster_status_shows_workers(self):
        out = subprocess.run([WEFT, "cluster", "status", "--serve", SERVER.url], capture_output=True, text=True,
                             timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.splitlines()
        self.assertTrue(any(l.startswith("prefill-0") and " prefill " in l for l in lines), out.stdout)
        self.assertTrue(any(l.startswith("decode-0") and " decode " in l for l in lines), out.stdout)
        self.assertTrue(any(l.startswith("worker-node-0") for l in lines), out.stdout)
        js = subprocess.run([WEFT, "cluster", "status", "--serve", SERVER.url, "--json"], capture_output=True,
                            text=True, timeout=60)
        self.assertEqual(sorted(w["role"] for w in json.loads(js.stdout)["router"]["workers"]), ["decode", "prefill"])

    def test_concurrent_streams(self):
        def one(i):
            body = {"prompt": "Item %d:" % i, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
            return completion(SERVER, body)[0]

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            results = list(pool.map(one, range(16)))
        for text, finish, _ in results:
            self.assertEqual(finish, "length")
            self.assertTrue(text)
        # Same prompt alone gives the same text as inside the crowd.
        self.assertEqual(one(5), results[5])
        self.assertEqual(SERVER.wait_kv_free(), 0)

    def test_client_disconnect_frees_kv_on_both_workers(self):
        self.assertGreaterEqual(SERVER.disconnect_mid_stream(), 1)
        self.assertEqual(SERVER.wait_kv_free(), 0)


def refused(args, what):
    out = subprocess.run([WEFT, "serve", "--port", "0"] + args, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, (args, out.returncode, out.stderr[-500:])
    assert what in out.stderr + out.stdout, (args, out.stderr[-500:])


def main():
    global WEFT, SERVER
    args, rest = parse_test_args()
    if args is None:
        return 77
    WEFT = args.weft
    refused(["--prefill", "1"], "at least one prefill and one decode worker")
    common = ["--kv-blocks", "512", "--max-running", "16"]
    with WeftServer(WEFT, ["--workers", "1"] + common) as ref:
        for name, body in CASES:
            REFERENCE[name] = completion(ref, body)
    with WeftServer(WEFT, ["--prefill", "1", "--decode", "1"] + common) as srv:
        SERVER = srv
        prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
        if not prog.result.wasSuccessful():
            sys.stderr.write("".join(srv.log_lines[-60:]))
        return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
