#!/usr/bin/env python3
"""POST /v1/embeddings end to end on the default model, checked against llama.cpp
(llama-cpp-python, the same GGUF, the same pooling, L2-normalized): mean pooling (the default) and
last-token pooling (`--pooling last`) give llama.cpp's vectors; the official `openai` client (which
asks for base64) gets the float answer's vectors; token-id input equals text input; a batch equals
its inputs one by one and runs beside a generation; `normalize: false` gives the raw vector;
bad requests are 400s naming the field, an unknown model a 404.

Usage: test_embeddings.py --weft PATH/TO/weft   (exit 77 = skipped: no model/packages; a failure
under CI=true)
"""
import argparse
import json
import math
import os
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
from cli_checks import check, finish  # noqa: E402
from weft_serve import WeftServer, default_model_path, missing_requirements, post_json  # noqa: E402

TEXTS = ["Hello world", "The cat sat on the mat.", "What is 23 plus 45?",
         "Embeddings map text to vectors; similar texts land close together."]


def max_diff(a, b):
    return max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) else float("inf")


def embed(srv, body):
    status, out = srv.request("POST", "/v1/embeddings", body)
    return status, json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    a = ap.parse_args()
    if (rc := missing_requirements("llama_cpp", "openai")) is not None:
        return rc
    import llama_cpp
    import openai

    model = default_model_path()
    refs = {}
    for name, kind in (("mean", llama_cpp.LLAMA_POOLING_TYPE_MEAN),
                       ("last", llama_cpp.LLAMA_POOLING_TYPE_LAST)):
        llm = llama_cpp.Llama(model, embedding=True, pooling_type=kind, n_ctx=512, n_threads=2,
                              verbose=False)
        refs[name] = [llm.embed(t, normalize=True) for t in TEXTS]
        del llm

    # llama.cpp's x86 numerics: the ggml kernel, whatever `auto` picks on this CPU.
    with WeftServer(a.weft, ["--cpu-matmul", "ggml"]) as srv:
        status, d = embed(srv, {"input": TEXTS})
        check(status == 200 and len(d.get("data", [])) == len(TEXTS), f"a batch answers ({status})")
        vecs = [e["embedding"] for e in sorted(d["data"], key=lambda e: e["index"])]
        for i, (v, r) in enumerate(zip(vecs, refs["mean"])):
            check(max_diff(v, r) < 1e-4, f"mean pooling, input {i}: llama.cpp's vector "
                                         f"(max |diff| {max_diff(v, r):.2e}, {len(v)} dims)")
            check(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-5, f"input {i} has unit norm")
        status, tok = srv.request("POST", "/tokenize", {"content": TEXTS[1], "add_special": True})
        ids = json.loads(tok)["tokens"]
        check(d["usage"]["prompt_tokens"] >= len(ids) and d["object"] == "list",
              f"usage counts the inputs' tokens ({d['usage']})")
        status, t = embed(srv, {"input": ids})
        check(status == 200 and max_diff(t["data"][0]["embedding"], vecs[1]) < 1e-6,
              "token ids give the text's vector")

        # A batch equals its inputs one by one, also while a generation runs beside it.
        gen = threading.Thread(target=post_json, args=(srv.url, "/v1/completions", {
            "prompt": "Once upon a time", "max_tokens": 48, "temperature": 0}))
        gen.start()
        single = [embed(srv, {"input": x})[1]["data"][0]["embedding"] for x in TEXTS]
        gen.join()
        worst = max(max_diff(s, v) for s, v in zip(single, vecs))
        check(worst < 1e-5, f"one by one = batched (max |diff| {worst:.2e})")

        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
        r = client.embeddings.create(model="SmolLM2-135M-Instruct.Q4_1", input=TEXTS[:2])
        got = [list(e.embedding) for e in r.data]
        check(max(max_diff(g, v) for g, v in zip(got, vecs)) < 1e-7,
              "the openai client (base64 by default) gets the float answer's vectors")
        check(r.usage.prompt_tokens > 0, f"openai client usage ({r.usage.prompt_tokens} tokens)")

        status, raw = embed(srv, {"input": TEXTS[0], "normalize": False})
        v = raw["data"][0]["embedding"]
        norm = math.sqrt(sum(x * x for x in v))
        check(status == 200 and norm > 1.5 and max_diff([x / norm for x in v], vecs[0]) < 1e-5,
              f"normalize false: the raw vector (norm {norm:.2f}), same direction")

        for body, param, what in (
                ({"input": ""}, "input", "an empty input"),
                ({"input": []}, "input", "an empty list"),
                ({"input": ["ok", ""]}, "input", "an empty string in a list"),
                ({"input": [1, 99999999]}, "input", "a token id outside the vocabulary"),
                ({"input": [[1, 2], 3]}, "input", "mixed shapes"),
                ({"input": "hi", "dimensions": 3}, "dimensions", "other dimensions"),
                ({"input": "hi", "encoding_format": "int8"}, "encoding_format", "a bad encoding"),
                ({"input": "word " * 9000}, "input", "an input longer than the context"),
                ({"nope": 1}, "input", "no input")):
            status, e = embed(srv, body)
            check(status == 400 and e.get("error", {}).get("param") == param,
                  f"{what} is a 400 naming '{param}' ({status} {e.get('error', {}).get('message')})")
        status, e = embed(srv, {"input": "hi", "model": "gpt-4"})
        check(status == 404 and e["error"]["code"] == "model_not_found", f"unknown model 404 ({status})")
        status, _ = srv.request("POST", "/v1/embeddings", b"{not json")
        check(status == 400, f"malformed JSON is a 400 ({status})")

    with WeftServer(a.weft, ["--cpu-matmul", "ggml", "--pooling", "last"]) as srv:
        status, d = embed(srv, {"input": TEXTS})
        for i, e in enumerate(sorted(d.get("data", []), key=lambda e: e["index"])):
            diff = max_diff(e["embedding"], refs["last"][i])
            check(diff < 1e-4, f"--pooling last, input {i}: llama.cpp's vector (max |diff| {diff:.2e})")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
