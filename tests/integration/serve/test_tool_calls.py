#!/usr/bin/env python3
"""Tool calling end to end, through the official `openai` client against `weft serve` on the
default model: tool_choice "required" (one call and parallel calls), a named function, "auto" and
"none"; streamed deltas assemble to the same calls as the whole response; every call names a listed
tool and its arguments validate against the tool's schema (Python's `jsonschema`); a tool result fed
back is answered; a worker SIGKILLed mid-call migrates and the call still parses; bad tool requests
are 400s naming the field.

Usage: test_tool_calls.py --weft PATH/TO/weft   (exit 77 = skipped: no model/packages; a failure
under CI=true)
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

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"]}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "JST"]}},
        "required": ["zone"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Current time in a zone",
                                      "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    a = ap.parse_args()
    if (rc := missing_requirements("jsonschema", "openai")) is not None:
        return rc
    import jsonschema
    import openai

    def valid_calls(calls, what, names=None):
        check(bool(calls), f"{what}: at least one tool call")
        for i, c in enumerate(calls or []):
            check(c.type == "function" and c.id.startswith("call_"), f"{what}: call {i} id/type")
            name = c.function.name
            check(name in (names or SCHEMAS), f"{what}: call {i} names a listed tool ({name})")
            try:
                args = json.loads(c.function.arguments)
            except json.JSONDecodeError as e:
                check(False, f"{what}: call {i} arguments parse ({e}): {c.function.arguments!r}")
                continue
            errs = list(jsonschema.Draft202012Validator(SCHEMAS.get(name, {})).iter_errors(args))
            check(not errs, f"{what}: call {i} arguments validate "
                            f"({errs[0].message if errs else c.function.arguments})")

    with WeftServer(a.weft, ["--workers", "2"]) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
        msgs = [{"role": "user", "content": "What is the weather in Paris, and the time in Tokyo?"}]

        # Required, greedy, whole; one call (with parallel calls allowed this small model, greedy,
        # goes on calling until max_tokens, as the grammar lets it: see the parallel case below).
        r = client.chat.completions.create(model=MODEL_ID, messages=msgs, tools=TOOLS,
                                           tool_choice="required", parallel_tool_calls=False,
                                           temperature=0, max_tokens=200)
        c = r.choices[0]
        check(c.finish_reason == "tool_calls", f"required: finish_reason tool_calls ({c.finish_reason})")
        check(c.message.content is None, f"required: no content ({c.message.content!r})")
        valid_calls(c.message.tool_calls, "required")
        whole = [(t.function.name, t.function.arguments) for t in c.message.tool_calls or []]

        # The same request streamed: deltas by index assemble to the same calls.
        calls, finish_reason, content = {}, None, ""
        for chunk in client.chat.completions.create(model=MODEL_ID, messages=msgs, tools=TOOLS,
                                                    tool_choice="required", temperature=0,
                                                    parallel_tool_calls=False, max_tokens=200,
                                                    stream=True):
            if not chunk.choices:
                continue
            d = chunk.choices[0].delta
            content += d.content or ""
            for t in d.tool_calls or []:
                slot = calls.setdefault(t.index, {"name": "", "arguments": ""})
                if t.function.name:
                    slot["name"] += t.function.name
                slot["arguments"] += t.function.arguments or ""
            finish_reason = chunk.choices[0].finish_reason or finish_reason
        streamed = [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)]
        check(streamed == whole, f"streamed calls equal the whole response's: {streamed} vs {whole}")
        check(finish_reason == "tool_calls" and content == "",
              f"streamed: finish_reason {finish_reason}, content {content!r}")

        # A named function, sampled, n = 2; one call each without parallel calls.
        r = client.chat.completions.create(
            model=MODEL_ID, messages=msgs, tools=TOOLS, temperature=1.0, seed=3, n=2,
            tool_choice={"type": "function", "function": {"name": "get_time"}}, max_tokens=120)
        for i, c in enumerate(r.choices):
            valid_calls(c.message.tool_calls, f"named, choice {i}", names=["get_time"])
            check(len(c.message.tool_calls or []) == 1, f"named, choice {i}: exactly one call")
        r = client.chat.completions.create(model=MODEL_ID, messages=msgs, tools=TOOLS,
                                           tool_choice="required", parallel_tool_calls=False,
                                           temperature=0.7, seed=8, max_tokens=200)
        check(len(r.choices[0].message.tool_calls or []) == 1,
              "parallel_tool_calls false: exactly one call")
        # Parallel calls (the default): every finished call is a valid call; a call cut by
        # max_tokens stays as text with finish_reason length, never a broken call.
        r = client.chat.completions.create(model=MODEL_ID, messages=msgs, tools=TOOLS,
                                           tool_choice="required", temperature=0.9, seed=21,
                                           max_tokens=200)
        c = r.choices[0]
        valid_calls(c.message.tool_calls, "parallel")
        check(c.finish_reason == "tool_calls"
              or (c.finish_reason == "length" and (c.message.content or "").lstrip().startswith("<tool_call>")),
              f"parallel: tool_calls, or length with the cut call as text ({c.finish_reason})")

        # The call and its result fed back; the model answers in text (tool_choice none).
        first = whole[0] if whole else ("get_weather", '{"city": "Paris", "unit": "celsius"}')
        history = msgs + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_a", "type": "function",
                 "function": {"name": first[0], "arguments": first[1]}}]},
            {"role": "tool", "tool_call_id": "call_a", "content": '{"temperature": 18}'}]
        r = client.chat.completions.create(model=MODEL_ID, messages=history, tools=TOOLS,
                                           tool_choice="none", temperature=0, max_tokens=40)
        c = r.choices[0]
        check(c.finish_reason in ("stop", "length") and isinstance(c.message.content, str)
              and not c.message.tool_calls, f"tool result answered in text: {c.message.content!r}")
        # auto: the model decides; whatever it writes comes back as content or valid calls.
        r = client.chat.completions.create(model=MODEL_ID, messages=msgs, tools=TOOLS,
                                           temperature=0, max_tokens=120)
        c = r.choices[0]
        if c.message.tool_calls:
            valid_calls(c.message.tool_calls, "auto")
        else:
            check(isinstance(c.message.content, str), "auto: text content")

        # Errors: 400 naming the field.
        for what, req, param in [
            ("unknown named function", {"tools": TOOLS, "tool_choice": {
                "type": "function", "function": {"name": "launch"}}}, "tool_choice"),
            ("required without tools", {"tool_choice": "required"}, "tool_choice"),
            ("strict with auto", {"tools": [{"type": "function", "function": {
                "name": "f", "strict": True, "parameters": TIME}}]}, "tools"),
            ("unenforceable schema", {"tool_choice": "required", "tools": [{
                "type": "function", "function": {"name": "f", "parameters": {
                    "type": "object", "properties": {"d": {"type": "string", "format": "date"}}}}}]},
             "tools"),
            ("bad history arguments", {"messages": [{"role": "assistant", "tool_calls": [{
                "id": "x", "type": "function", "function": {"name": "f", "arguments": "{"}}]}]},
             "messages[0].tool_calls[0].function.arguments"),
        ]:
            body = {"model": MODEL_ID, "messages": msgs, "max_tokens": 5}
            body.update(req)
            st, resp = post(srv.url, "/v1/chat/completions", body)
            err = resp.get("error", {})
            check(st == 400 and err.get("param") == param,
                  f"{what}: 400 naming {param} ({st}: {err.get('param')}: {err.get('message', '')[:100]})")

        # A worker SIGKILLed while it writes a required call: the request migrates with its
        # grammar state, and the call still parses and validates.
        calls, victim = {}, None
        for chunk in client.chat.completions.create(model=MODEL_ID, messages=msgs, tools=TOOLS,
                                                    tool_choice="required", temperature=0.9,
                                                    seed=21, max_tokens=200, stream=True):
            if victim is None:
                busy = [w for w in srv.admin()["router"]["workers"] if w["inflight"] > 0]
                if busy:
                    victim = busy[0]
                    os.kill(victim["pid"], signal.SIGKILL)
            if chunk.choices:
                for t in chunk.choices[0].delta.tool_calls or []:
                    slot = calls.setdefault(t.index, {"name": "", "arguments": ""})
                    slot["name"] += t.function.name or ""
                    slot["arguments"] += t.function.arguments or ""
        check(victim is not None, "a worker was killed mid-call")

        class _F:  # the shape valid_calls reads
            def __init__(self, i, s):
                self.type, self.id = "function", f"call_{i}"
                self.function = type("fn", (), {"name": s["name"], "arguments": s["arguments"]})
        valid_calls([_F(i, calls[i]) for i in sorted(calls)], "across a migration")

    # Other families' formats: a chat template that renders tools in Llama 3.1's or Mistral's way
    # makes the server parse calls in that format (--tool-call-parser auto); required and named
    # calls are forced in it, whole and streamed, and a conversation with a call and its result
    # goes back in.
    here = os.path.dirname(os.path.abspath(__file__))
    for tmpl, fmt in (("llama31_tools.jinja", "llama3_json"), ("mistral_tools.jinja", "mistral")):
        with WeftServer(a.weft, ["--chat-template", os.path.join(here, "templates", tmpl)]) as srv:
            check(any(f"tool calls: {fmt} format (from the chat template)" in line
                      for line in srv.log_lines), f"{tmpl}: the server parses {fmt} calls")
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
            msgs = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
            r = client.chat.completions.create(model=MODEL_ID, messages=msgs, tools=TOOLS,
                                               tool_choice="required", temperature=0,
                                               max_tokens=96)
            c = r.choices[0]
            check(c.finish_reason == "tool_calls", f"{fmt}: required call ({c.finish_reason}, "
                                                   f"{c.message.content!r})")
            valid_calls(c.message.tool_calls, f"{fmt} required")
            named = {"type": "function", "function": {"name": "get_time"}}
            whole = client.chat.completions.create(model=MODEL_ID, messages=msgs, tools=TOOLS,
                                                   tool_choice=named, temperature=0, max_tokens=64)
            streamed = {}
            for chunk in client.chat.completions.create(model=MODEL_ID, messages=msgs,
                                                        tools=TOOLS, tool_choice=named,
                                                        temperature=0, max_tokens=64,
                                                        stream=True):
                for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                    e = streamed.setdefault(d.index, {"name": "", "arguments": ""})
                    e["name"] += d.function.name or ""
                    e["arguments"] += d.function.arguments or ""
            wc = whole.choices[0].message.tool_calls or []
            check(len(wc) == 1 and wc[0].function.name == "get_time", f"{fmt}: named call")
            check([(e["name"], e["arguments"]) for _, e in sorted(streamed.items())] ==
                  [(x.function.name, x.function.arguments) for x in wc],
                  f"{fmt}: streamed named call = whole ({streamed})")
            if wc:
                history = msgs + [{"role": "assistant", "content": None, "tool_calls": [
                    {"id": wc[0].id, "type": "function", "function": {
                        "name": wc[0].function.name, "arguments": wc[0].function.arguments}}]},
                    {"role": "tool", "tool_call_id": wc[0].id, "content": "12:00 UTC"}]
                r = client.chat.completions.create(model=MODEL_ID, messages=history, tools=TOOLS,
                                                   temperature=0, max_tokens=16)
                check(r.choices[0].finish_reason in ("stop", "length", "tool_calls"),
                      f"{fmt}: a call and its result go back in ({r.choices[0].finish_reason})")

    return finish()


if __name__ == "__main__":
    sys.exit(main())
