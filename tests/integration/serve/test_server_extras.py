#!/usr/bin/env python3
"""What a user of vLLM or llama-server reaches for beside completions, against `weft serve` on the
default model: POST /tokenize and /detokenize in both servers' forms (token ids checked against
llama.cpp's own tokenizer on the same GGUF), GET /v1/models/{id}, --ctx-size, CORS for --allowed-origins, the
ready line naming --served-model-name, logit_bias against llama.cpp's, Prometheus counters present at 0 before any request (and
cumulative values typed as counters), and `weft generate -p -` reading the prompt from stdin.

Usage: test_server_extras.py --weft PATH/TO/weft   (exit 77 = skipped: no model; a failure under CI=true)
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
from cli_checks import check, finish  # noqa: E402
from weft_serve import WeftServer, default_model_path  # noqa: E402

TEXTS = ["Hello world", "  leading spaces and émojis 🚀 ünïcode", "def f(x):\n    return x*2\n",
         "<|im_start|>user"]


def raw(srv, method, path, body=None, headers=None):
    """(status, headers, body) of one request, without raising on 4xx."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(srv.url + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    a = ap.parse_args()
    model = default_model_path()
    if not os.path.exists(model):
        if os.environ.get("CI", "") not in ("", "0", "false"):
            print("FAIL: CI=true and the default model is missing")
            return 1
        print("SKIP: default model not found (scripts/fetch_model.sh)")
        return 77
    try:
        import llama_cpp
        ref = llama_cpp.Llama(model_path=str(model), vocab_only=True, verbose=False)
    except ImportError:
        ref = None
        check(os.environ.get("CI", "") in ("", "0", "false"),
              "llama-cpp-python is installed (scripts/setup.sh --test)")

    p = subprocess.run([a.weft, "serve", "--ctx-size", "100000"], capture_output=True, text=True,
                       timeout=120)
    check(p.returncode == 2 and "beyond the model's context of 8192" in p.stderr,
          "--ctx-size beyond the model's context is refused")
    # --cpu-matmul ggml: llama.cpp's numerics on any host (the logit_bias check compares texts).
    with WeftServer(a.weft, ["--served-model-name", "smol", "--ctx-size", "256", "--cpu-matmul", "ggml",
                             "--allowed-origins", "http://app.example,http://other.example"]) as srv:
        check("model=smol" in (srv.ready_line or ""),
              f"the ready line names --served-model-name: {srv.ready_line}")

        # Counters exist at 0 before the first request; cumulative values are counters.
        st, _, text = raw(srv, "GET", "/metrics")
        check(st == 200 and "\nweft_generation_tokens_total 0\n" in text and
              'weft_requests_total{endpoint="completions",outcome="ok"} 0' in text,
              "counters are exported at 0 before any request")
        types = dict(line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE"))
        check(all(t == "counter" for n, t in types.items() if n.endswith("_total")) and
              types.get("weft_worker_steps_total") == "counter" and "weft_worker_steps" not in types,
              "every *_total family is a counter (worker steps included)")

        # /tokenize, llama-server's form, against llama.cpp's tokenizer.
        for t in TEXTS:
            for special in (False, True):
                st, _, body = raw(srv, "POST", "/tokenize", {"content": t, "add_special": special})
                got = json.loads(body).get("tokens") if st == 200 else None
                if ref is not None:
                    want = ref.tokenize(t.encode(), add_bos=special, special=False)
                    check(got == want, f"/tokenize {t[:24]!r} add_special={special} equals "
                                       f"llama.cpp's tokens ({got} vs {want})")
                st, _, body = raw(srv, "POST", "/detokenize", {"tokens": got or []})
                check(st == 200 and json.loads(body)["content"] == t and
                      json.loads(body)["prompt"] == t, f"/detokenize round-trips {t[:24]!r}")
        st, _, body = raw(srv, "POST", "/tokenize", {"content": "Hello world", "with_pieces": True})
        pieces = json.loads(body)["tokens"] if st == 200 else []
        check(st == 200 and "".join(p["piece"] for p in pieces) == "Hello world" and
              all(isinstance(p["id"], int) for p in pieces), "with_pieces gives id and piece")
        # vLLM's form: prompt, add_special_tokens (default true), count and max_model_len.
        st, _, body = raw(srv, "POST", "/tokenize", {"model": "smol", "prompt": "Hello world"})
        j = json.loads(body)
        check(st == 200 and j["count"] == len(j["tokens"]) and j["max_model_len"] == 256,
              f"vLLM form: count and max_model_len = --ctx-size ({body[:120]})")
        # --ctx-size bounds prompt + completion.
        st, _, body = raw(srv, "POST", "/v1/completions",
                          {"prompt": " the" * 200, "max_tokens": 100})
        check(st == 400 and "context_length_exceeded" in body and " 256 " in body,
              f"--ctx-size 256: 200 + 100 tokens is a 400 context_length_exceeded ({body[:160]})")
        st, _, body = raw(srv, "POST", "/v1/completions", {"prompt": " the" * 200, "max_tokens": 50})
        check(st == 200, f"--ctx-size 256: 200 + 50 tokens is served ({st})")
        # messages: the same tokens the chat endpoint counts as its prompt.
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
        st, _, body = raw(srv, "POST", "/tokenize", {"messages": msgs})
        count = json.loads(body).get("count") if st == 200 else None
        st2, _, body2 = raw(srv, "POST", "/v1/chat/completions",
                            {"messages": msgs, "max_tokens": 1})
        used = json.loads(body2)["usage"]["prompt_tokens"] if st2 == 200 else None
        check(count is not None and count == used,
              f"/tokenize messages counts what /v1/chat/completions counts ({count} vs {used})")
        # Bad input: a clear 400.
        for path, b, what in [("/tokenize", b"{nope", "malformed JSON"),
                              ("/tokenize", {"content": 5}, "a non-string content"),
                              ("/tokenize", {"content": "x", "add_special": "yes"}, "a non-bool flag"),
                              ("/detokenize", {"tokens": [1, 10 ** 9]}, "an id outside the vocabulary"),
                              ("/detokenize", {"tokens": "1 2"}, "tokens not a list")]:
            st, _, body = raw(srv, "POST", path, b)
            err = json.loads(body).get("error", {}) if body.startswith("{") else {}
            check(st == 400 and err.get("message"), f"{path} with {what}: 400 with a message "
                                                     f"({st} {body[:100]})")

        # GET /v1/models/{id}
        st, _, body = raw(srv, "GET", "/v1/models/smol")
        check(st == 200 and json.loads(body)["id"] == "smol" and
              json.loads(body)["max_model_len"] == 256, "GET /v1/models/smol")
        st, _, body = raw(srv, "GET", "/v1/models/gpt-4")
        check(st == 404 and json.loads(body)["error"]["code"] == "model_not_found",
              "GET /v1/models/<unknown> is a 404 model_not_found")

        # CORS: allowed origins get the header on preflight and on real answers; others do not.
        st, h, _ = raw(srv, "OPTIONS", "/v1/completions",
                       headers={"Origin": "http://app.example",
                                "Access-Control-Request-Method": "POST"})
        check(st == 204 and h.get("Access-Control-Allow-Origin") == "http://app.example" and
              "POST" in h.get("Access-Control-Allow-Methods", ""), f"preflight from an allowed origin: {st} {h}")
        st, h, _ = raw(srv, "OPTIONS", "/v1/completions", headers={"Origin": "http://evil.example"})
        check(st == 403 and "Access-Control-Allow-Origin" not in h, "preflight from another origin: 403")
        st, h, _ = raw(srv, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2},
                       headers={"Origin": "http://other.example"})
        check(st == 200 and h.get("Access-Control-Allow-Origin") == "http://other.example",
              "a completion for an allowed origin carries Access-Control-Allow-Origin")
        st, h, _ = raw(srv, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
        check(st == 200 and "Access-Control-Allow-Origin" not in h, "no Origin, no CORS header")
        # logit_bias against llama.cpp's on the same GGUF (greedy, token-id prompt): the first
        # greedy token banned, another lifted; a bad entry is a 400 naming the field.
        if ref is not None:
            full = llama_cpp.Llama(model_path=str(model), n_ctx=256, n_threads=2, verbose=False)
            toks = full.tokenize(b"The capital of France is", add_bos=False, special=False)

            def both(bias, n=8):
                st, _, body = raw(srv, "POST", "/v1/completions",
                                  {"prompt": toks, "max_tokens": n, "temperature": 0,
                                   "logit_bias": {str(k): v for k, v in bias.items()}})
                mine = json.loads(body)["choices"][0]["text"] if st == 200 else f"HTTP {st} {body}"
                theirs = full.create_completion(toks, max_tokens=n, temperature=0,
                                                logit_bias=bias or None)["choices"][0]["text"]
                return mine, theirs
            mine, theirs = both({})
            check(mine == theirs, f"greedy without logit_bias: weft == llama.cpp ({mine!r} vs {theirs!r})")
            first = full.tokenize(theirs.encode(), add_bos=False, special=False)[0]
            banned, theirs_banned = both({first: -100})
            check(banned == theirs_banned and banned != mine,
                  f"logit_bias bans the first greedy token {first}: weft == llama.cpp "
                  f"({banned!r} vs {theirs_banned!r})")
            london = full.tokenize(b" London", add_bos=False, special=False)[0]
            lifted, theirs_lifted = both({first: -100, london: 8.5})
            check(lifted == theirs_lifted and lifted.startswith(" London"),
                  f"a ban and a lift together: weft == llama.cpp ({lifted!r} vs {theirs_lifted!r})")
            del full
        for bad in [{"x": 1}, {"5": 101}, {"99999999": -1}]:
            st, _, body = raw(srv, "POST", "/v1/completions",
                              {"prompt": "Hi", "max_tokens": 1, "logit_bias": bad})
            check(st == 400 and json.loads(body)["error"]["param"] == "logit_bias",
                  f"logit_bias {bad}: 400 naming logit_bias ({body[:160]})")
        # A priority on a first-come-first-served server is refused, not ignored.
        st, _, body = raw(srv, "POST", "/v1/completions", {"prompt": "Hi", "priority": -1})
        check(st == 400 and json.loads(body)["error"]["param"] == "priority" and
              "--policy priority" in body, f"priority without --policy priority: 400 ({body[:160]})")

    # Without --allowed-origins there are no CORS headers at all; --api-key guards /tokenize.
    # --policy priority with one sequence decoding at a time: a later request with a lower
    # priority value preempts the one running.
    with WeftServer(a.weft, ["--api-key", "k1", "--policy", "priority", "--max-running", "1"]) as srv:
        st, h, _ = raw(srv, "OPTIONS", "/v1/completions", headers={"Origin": "http://app.example"})
        check("Access-Control-Allow-Origin" not in h, "no --allowed-origins: no CORS headers")
        st, _, _ = raw(srv, "POST", "/tokenize", {"content": "x"})
        st2, _, _ = raw(srv, "POST", "/tokenize", {"content": "x"}, {"Authorization": "Bearer k1"})
        check(st == 401 and st2 == 200, f"--api-key guards /tokenize ({st}, {st2})")
        auth = {"Authorization": "Bearer k1"}
        done = {}

        def long_request():
            done["long"] = raw(srv, "POST", "/v1/completions",
                               {"prompt": "Once upon a time", "max_tokens": 600, "ignore_eos": True,
                                "temperature": 0}, auth)[0]
            done["long_at"] = time.monotonic()
        t = threading.Thread(target=long_request)
        t.start()
        time.sleep(0.5)
        st, _, body = raw(srv, "POST", "/v1/completions",
                          {"prompt": "Hi", "max_tokens": 4, "priority": -1}, auth)
        short_at = time.monotonic()
        t.join()
        check(st == 200 and done.get("long") == 200 and short_at < done["long_at"],
              f"--policy priority: a later request with priority -1 finishes before a 600-token "
              f"one running alone ({st}, {done.get('long')}, {done.get('long_at', 0) - short_at:.2f} s)")

    # weft generate: -p - reads stdin; --help shows the defaults.
    p = subprocess.run([a.weft, "generate", "-p", "-", "-n", "4"], input="Once upon a time",
                       capture_output=True, text=True, timeout=300)
    check(p.returncode == 0 and len(p.stdout.strip()) > 0, f"generate -p - reads stdin: {p.stdout!r}")
    p = subprocess.run([a.weft, "generate", "-p", "-"], input="", capture_output=True, text=True,
                       timeout=300)
    check(p.returncode == 2 and "stdin was empty" in p.stderr, "generate -p - with empty stdin: exit 2")
    p = subprocess.run([a.weft, "generate", "--help"], capture_output=True, text=True)
    line = next((x for x in p.stdout.splitlines() if "--max-tokens" in x), "")
    tline = next((x for x in p.stdout.splitlines() if "--temperature" in x), "")
    check(line.split()[1].endswith("=128") and tline.split()[1].endswith("=0"),
          f"generate --help shows the defaults: {line.strip()} / {tline.strip()}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
