"""`weft serve` driven by the official `openai` Python client (and raw HTTP for bad input).

Usage: test_openai_client.py --weft PATH/TO/weft     (exit 77 = skipped: no openai package or model)
"""
import concurrent.futures
import json
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
from weft_serve import WeftServer, parse_test_args, weft_generate  # noqa: E402

WEFT = None
SERVER = None
MODEL_ID = "SmolLM2-135M-Instruct.Q4_1"

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "List three colors:",
]


def client(**kw):
    import openai
    return openai.OpenAI(base_url=SERVER.url + "/v1", api_key="unused", max_retries=0, timeout=300, **kw)


class OpenAIClientTest(unittest.TestCase):
    def test_models(self):
        ids = [m.id for m in client().models.list().data]
        self.assertEqual(ids, [MODEL_ID])

    def test_greedy_completion_equals_weft_generate(self):
        c = client()
        for prompt in PROMPTS:
            want = weft_generate(WEFT, prompt, 24)
            got = c.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=24, temperature=0)
            self.assertEqual(got.choices[0].text, want, prompt)
            self.assertIn(got.choices[0].finish_reason, ("stop", "length"))
            self.assertGreater(got.usage.prompt_tokens, 0)
            self.assertLessEqual(got.usage.completion_tokens, 24)

    def test_stream_equals_non_stream(self):
        c = client()
        full = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Name a fruit."}],
                                         max_tokens=32, temperature=0)
        chunks = list(c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Name a fruit."}],
                                                max_tokens=32, temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        self.assertEqual(text, full.choices[0].message.content)
        self.assertEqual(full.choices[0].message.role, "assistant")
        finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        self.assertEqual(finishes, [full.choices[0].finish_reason])
        usage = [ch.usage for ch in chunks if ch.usage is not None]
        self.assertEqual(len(usage), 1)
        self.assertEqual(usage[0].completion_tokens, full.usage.completion_tokens)
        self.assertEqual(usage[0].prompt_tokens, full.usage.prompt_tokens)

    def test_completion_stream(self):
        c = client()
        want = c.completions.create(model=MODEL_ID, prompt=PROMPTS[1], max_tokens=20, temperature=0).choices[0].text
        got = "".join(ch.choices[0].text for ch in c.completions.create(
            model=MODEL_ID, prompt=PROMPTS[1], max_tokens=20, temperature=0, stream=True) if ch.choices)
        self.assertEqual(got, want)

    def test_stop_strings(self):
        c = client()
        base = c.completions.create(model=MODEL_ID, prompt=PROMPTS[2], max_tokens=40, temperature=0).choices[0].text
        words = base.split()
        self.assertGreater(len(words), 4, base)
        stop = words[3]
        cut = base[:base.index(stop)]
        for stream in (False, True):
            if stream:
                chunks = list(c.completions.create(model=MODEL_ID, prompt=PROMPTS[2], max_tokens=40, temperature=0,
                                                   stop=[stop], stream=True))
                text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
                finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
                self.assertEqual(finish, ["stop"])
            else:
                r = c.completions.create(model=MODEL_ID, prompt=PROMPTS[2], max_tokens=40, temperature=0, stop=[stop])
                text = r.choices[0].text
                self.assertEqual(r.choices[0].finish_reason, "stop")
            self.assertEqual(text, cut, "stream=%s" % stream)
            self.assertNotIn(stop, text)

    def test_n_and_seed_reproducibility(self):
        c = client()
        kw = dict(model=MODEL_ID, messages=[{"role": "user", "content": "Write a word."}], max_tokens=12,
                  temperature=1.0, top_p=0.95, n=3, seed=1234)
        a = c.chat.completions.create(**kw)
        b = c.chat.completions.create(**kw)
        self.assertEqual(len(a.choices), 3)
        self.assertEqual(sorted(ch.index for ch in a.choices), [0, 1, 2])
        self.assertEqual([ch.message.content for ch in a.choices], [ch.message.content for ch in b.choices])
        other = c.chat.completions.create(**dict(kw, seed=99))
        self.assertNotEqual([ch.message.content for ch in a.choices], [ch.message.content for ch in other.choices])

    def test_n_choices_prefill_their_prompt_once(self):
        # One sequence per choice: those on one worker wait for the first one's prefill of the
        # shared prompt and reuse its blocks (in-flight prefix sharing), whatever their seeds. The
        # prompt (~780 tokens) is longer than one pass even with nothing decoding
        # (--idle-batch-tokens 512), so the first choice's prefill is still in flight when the
        # others are scheduled.
        c = client()
        before = SERVER.metric_sum("weft_cache_prefix_waits_total")
        prompt = " ".join("Line %d of a long shared prompt about rivers and mountains." % i for i in range(60))
        r = c.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=4, temperature=1.0, n=4, seed=7)
        self.assertEqual(len(r.choices), 4)
        # Two workers, four choices: at least two share a worker. Load reports come every 200 ms.
        deadline = time.time() + 5
        while SERVER.metric_sum("weft_cache_prefix_waits_total") <= before and time.time() < deadline:
            time.sleep(0.1)
        self.assertGreater(SERVER.metric_sum("weft_cache_prefix_waits_total"), before)
        self.assertGreater(r.usage.prompt_tokens_details.cached_tokens, 0)

    def test_logprobs(self):
        c = client()
        r = c.completions.create(model=MODEL_ID, prompt=PROMPTS[0], max_tokens=8, temperature=0, logprobs=3)
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), r.usage.completion_tokens)
        self.assertEqual(len(lp.token_logprobs), len(lp.tokens))
        self.assertEqual("".join(lp.tokens), r.choices[0].text)
        for tok, p, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            self.assertLessEqual(p, 0.0)
            self.assertLessEqual(len(top), 3)
            self.assertAlmostEqual(max(top.values()), p, places=4)  # greedy: the chosen token is the best
        chat = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                         temperature=0, logprobs=True, top_logprobs=2)
        content = chat.choices[0].logprobs.content
        self.assertEqual(len(content), chat.usage.completion_tokens)
        for e in content:
            self.assertEqual(len(e.top_logprobs), 2)
            self.assertLessEqual(e.logprob, 0.0)

    def test_usage_counts(self):
        c = client()
        r = c.completions.create(model=MODEL_ID, prompt="Hello", max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
        self.assertEqual(r.usage.completion_tokens, 5)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + 5)
        self.assertIsNotNone(r.usage.prompt_tokens_details)
        self.assertGreaterEqual(r.usage.prompt_tokens_details.cached_tokens, 0)

    def test_64_concurrent_streams(self):
        c = client()

        def one(i):
            chunks = list(c.completions.create(model=MODEL_ID, prompt="Count: %d," % i, max_tokens=8, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True}))
            text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
            finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
            return i, text, finish

        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            results = list(pool.map(one, range(64)))
        self.assertEqual(len(results), 64)
        for i, text, finish in results:
            self.assertEqual(finish, ["length"], i)
            self.assertTrue(text, i)
        # Same prompt alone gives the same greedy text as inside the crowd.
        alone = c.completions.create(model=MODEL_ID, prompt="Count: 7,", max_tokens=8, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
        self.assertEqual(alone, results[7][1])
        self.assertEqual(SERVER.wait_kv_free(), 0)

    def test_client_disconnect_frees_kv(self):
        before = SERVER.metric_sum("weft_generation_tokens_total")
        # The server notices at its next write, aborts the sequence and the worker frees its blocks
        # long before the 400 tokens could have been generated.
        self.assertGreaterEqual(SERVER.disconnect_mid_stream(), 1)
        self.assertEqual(SERVER.wait_kv_free(), 0)
        self.assertLess(SERVER.metric_sum("weft_generation_tokens_total") - before, 300)

    def test_abandoned_non_streaming_request_is_aborted(self):
        # `curl -m 3` giving up on a non-streaming request: the server notices at its next probe
        # of the connection, aborts the sequence, frees its KV and counts a disconnect (not "ok").
        before = SERVER.metric_sum("weft_generation_tokens_total")
        ok_before = SERVER.metric_sum_where("weft_requests_total", outcome="ok")
        self.assertGreaterEqual(SERVER.disconnect_mid_stream(stream=False, timeout_s=10), 1)
        self.assertEqual(SERVER.wait_kv_free(), 0)
        self.assertLess(SERVER.metric_sum("weft_generation_tokens_total") - before, 300)
        self.assertEqual(SERVER.metric_sum_where("weft_requests_total", outcome="ok"), ok_before)

    def test_health_and_metrics(self):
        status, body = SERVER.request("GET", "/health")
        self.assertEqual(status, 200, body)
        m = SERVER.metrics()
        names = {n for n, _ in m}
        for want in ("weft_ttft_seconds_count", "weft_tpot_seconds_bucket", "weft_kv_blocks_used", "weft_kv_blocks_free",
                     "weft_requests_total", "weft_router_requests_total"):
            self.assertIn(want, names)
        admin = SERVER.admin()
        self.assertEqual(len(admin["router"]["workers"]), 2)
        for w in admin["router"]["workers"]:
            for k in ("name", "pid", "role", "node_id", "state", "kv_blocks_used"):
                self.assertIn(k, w)
        self.assertGreaterEqual(len(admin["cluster"]["nodes"]), 3)


class BadInputTest(unittest.TestCase):
    def expect(self, path, body, status, param=None, code=None):
        got, text = SERVER.request("POST", path, body)
        self.assertEqual(got, status, text)
        err = json.loads(text)["error"]
        self.assertTrue(err["message"])
        self.assertIn("type", err)
        if param is not None:
            self.assertEqual(err.get("param"), param, text)
        if code is not None:
            self.assertEqual(err.get("code"), code, text)

    def test_bad_requests_get_4xx_and_server_keeps_serving(self):
        p = "/v1/completions"
        self.expect(p, b"{not json", 400)
        self.expect(p, b"[1, 2]", 400)
        self.expect(p, {"prompt": "hi", "max_tokens": "ten"}, 400, param="max_tokens")
        self.expect(p, {"prompt": "hi", "temperature": "hot"}, 400, param="temperature")
        self.expect(p, {"prompt": "hi", "max_tokens": -5}, 400, param="max_tokens")
        self.expect(p, {"prompt": "hi", "n": 100000}, 400, param="n")
        self.expect(p, {"prompt": "hi", "top_p": 7}, 400, param="top_p")
        self.expect(p, {"prompt": "hi", "max_tokens": 10 ** 12}, 400, param="max_tokens")
        self.expect(p, {"max_tokens": 3}, 400, param="prompt")
        self.expect(p, {"prompt": "hi", "model": "gpt-9"}, 404, code="model_not_found")
        self.expect(p, {"prompt": "word " * 9000, "max_tokens": 4}, 400, code="context_length_exceeded")
        self.expect(p, {"prompt": [1, 2, 10 ** 9]}, 400, param="prompt")
        self.expect("/v1/chat/completions", {"messages": []}, 400, param="messages")
        self.expect("/v1/chat/completions", {"messages": [{"content": "no role"}]}, 400)
        self.expect("/v1/chat/completions", {"messages": "hello"}, 400, param="messages")
        got, text = SERVER.request("GET", "/v1/nothing")
        self.assertEqual(got, 404, text)
        self.assertIn("error", json.loads(text))
        # Still serving.
        r = client().completions.create(model=MODEL_ID, prompt="Hello", max_tokens=3, temperature=0)
        self.assertTrue(r.choices[0].text)


def main():
    global WEFT, SERVER
    try:
        import openai  # noqa: F401
    except ImportError:
        print("SKIP: the openai package is not installed (scripts/setup.sh --test installs it)")
        return 77
    args, rest = parse_test_args()
    if args is None:
        return 77
    WEFT = args.weft
    with WeftServer(WEFT, ["--workers", "2", "--kv-blocks", "768", "--max-running", "32"]) as srv:
        SERVER = srv
        t0 = time.time()
        prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
        print("openai client tests took %.1f s" % (time.time() - t0))
        if not prog.result.wasSuccessful():
            sys.stderr.write("".join(srv.log_lines[-60:]))
        return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
