#!/usr/bin/env python3
"""Structured outputs end to end, through the official `openai` client against `weft serve` on the
default model: response_format json_schema and json_object, llama.cpp's `grammar` and `json_schema`
fields, greedy and sampled, streamed and not, n > 1; every output parses and validates with Python's
`jsonschema`; bad schemas and grammars are 400s naming the problem; a migrated request (its worker
SIGKILLed mid-stream) still produces valid output.

Usage: test_structured_outputs.py --weft PATH/TO/weft   (exit 77 = skipped: no model/packages;
a failure under CI=true)
"""
import argparse
import json
import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
from cli_checks import check, finish  # noqa: E402
from weft_serve import WeftServer, missing_requirements, post_json as post  # noqa: E402

MODEL_ID = "SmolLM2-135M-Instruct.Q4_1"

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20},
    "age": {"type": "integer"},
    "city": {"enum": ["Paris", "London", "Tokyo"]},
    "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3}},
    "required": ["name", "age", "city", "hobbies"], "additionalProperties": False}

ORDER = {"$defs": {"item": {"type": "object", "properties": {
    "sku": {"type": "string", "maxLength": 8}, "qty": {"type": "integer"}},
    "required": ["sku", "qty"]}},
    "type": "object", "properties": {
        "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 2},
        "express": {"type": "boolean"}, "note": {"type": ["string", "null"], "maxLength": 12}},
    "required": ["items", "express"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    a = ap.parse_args()
    if (rc := missing_requirements("jsonschema", "openai")) is not None:
        return rc
    import jsonschema
    import openai

    with WeftServer(a.weft, ["--workers", "2"]) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
        msgs = [{"role": "user", "content": "Describe a person living in a big city as JSON."}]
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                        "strict": True}}

        def valid(text, schema, what):
            try:
                doc = json.loads(text)
            except json.JSONDecodeError as e:
                check(False, f"{what}: output parses as JSON ({e}): {text!r}")
                return
            errs = list(jsonschema.Draft202012Validator(schema).iter_errors(doc))
            check(not errs, f"{what}: validates ({errs[0].message if errs else text[:100]})")

        # Greedy, not streamed.
        r = client.chat.completions.create(model=MODEL_ID, messages=msgs, response_format=fmt,
                                           temperature=0, max_tokens=200)
        check(r.choices[0].finish_reason == "stop", f"greedy ends with stop: {r.choices[0].finish_reason}")
        valid(r.choices[0].message.content, PERSON, "json_schema, greedy")
        try:
            keys = list(json.loads(r.choices[0].message.content).keys())
        except json.JSONDecodeError:
            keys = []
        check(keys == ["name", "age", "city", "hobbies"], f"properties in the schema's order: {keys}")
        # Sampled, n = 3, seeded.
        r = client.chat.completions.create(model=MODEL_ID, messages=msgs, response_format=fmt,
                                           temperature=1.0, seed=11, n=3, max_tokens=200)
        for i, c in enumerate(r.choices):
            check(c.finish_reason == "stop", f"sampled choice {i} ends with stop")
            valid(c.message.content, PERSON, f"json_schema, sampled choice {i}")
        # Streamed.
        text = ""
        for chunk in client.chat.completions.create(model=MODEL_ID, messages=msgs,
                                                    response_format=fmt, temperature=0.8, seed=5,
                                                    max_tokens=200, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
        valid(text, PERSON, "json_schema, streamed")
        # json_object.
        r = client.chat.completions.create(model=MODEL_ID, messages=msgs, temperature=0,
                                           response_format={"type": "json_object"}, max_tokens=400)
        check(r.choices[0].finish_reason == "stop", f"json_object ends with stop: {r.choices[0].finish_reason}")
        valid(r.choices[0].message.content, {"type": "object"}, "json_object")
        # llama.cpp's fields on /v1/completions: json_schema and a GBNF grammar.
        st, body = post(srv.url, "/v1/completions", {
            "model": MODEL_ID, "prompt": "An order as JSON:", "json_schema": ORDER,
            "max_tokens": 200, "temperature": 0.9, "seed": 2})
        check(st == 200, f"completions with json_schema: HTTP {st}")
        if st == 200:
            valid(body["choices"][0]["text"], ORDER, "llama.cpp json_schema ($ref, arrays)")
        st, body = post(srv.url, "/v1/completions", {
            "model": MODEL_ID, "prompt": "Answer yes or no: is the sky blue?",
            "grammar": 'root ::= ("yes" | "no") "."', "max_tokens": 10, "temperature": 1.0,
            "seed": 9})
        check(st == 200 and body["choices"][0]["text"] in ("yes.", "no."),
              f"a GBNF grammar: {body.get('choices', [{}])[0].get('text')!r}")

        # Errors: 400 naming the problem.
        for what, req, needle in [
            ("unsupported keyword", {"response_format": {"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"type": "string", "pattern": "a+"}}}}, "'pattern'"),
            ("bad grammar", {"grammar": "root ::= undefined-rule"}, "undefined-rule"),
            ("two sources", {"grammar": 'root ::= "a"',
                             "response_format": {"type": "json_object"}}, "cannot be combined"),
            ("ignore_eos", {"response_format": {"type": "json_object"}, "ignore_eos": True},
             "ignore_eos"),
        ]:
            body = {"model": MODEL_ID, "messages": msgs, "max_tokens": 5}
            body.update(req)
            st, resp = post(srv.url, "/v1/chat/completions", body)
            msg = resp.get("error", {}).get("message", "")
            check(st == 400 and needle in msg, f"{what}: 400 naming it ({st}: {msg[:120]})")

        # A worker SIGKILLed mid-stream: the request migrates and its grammar state with it (the
        # new worker feeds the tokens generated so far through the grammar).
        text, victim = "", None
        stream = client.chat.completions.create(model=MODEL_ID, messages=msgs, response_format=fmt,
                                                temperature=0.9, seed=21, max_tokens=200,
                                                stream=True)
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
                if victim is None and len(text) > 12:
                    busy = [w for w in srv.admin()["router"]["workers"] if w["inflight"] > 0]
                    if busy:
                        victim = busy[0]
                        os.kill(victim["pid"], signal.SIGKILL)
        check(victim is not None, "a worker was killed mid-stream")
        valid(text, PERSON, "json_schema across a migration")

    return finish()


if __name__ == "__main__":
    sys.exit(main())
