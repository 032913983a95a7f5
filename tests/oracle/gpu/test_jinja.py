#!/usr/bin/env python3
"""weft's Jinja engine (gpu/jinja.hpp) against jinja2 configured as Hugging Face's
apply_chat_template configures it (sandboxed, trim_blocks, lstrip_blocks, loop controls, its own
`tojson` and `raise_exception`): every template below, written for this test in the styles of
widely used chat templates (ChatML with tools, Llama 3, Mistral, Gemma, Phi, reasoning models),
plus the default model's own template when it is present, is rendered over several conversations
with and without the generation prompt; the texts must be identical, and a template that raises
must raise in both.

Usage: test_jinja.py --render PATH/TO/weft_jinja_render   (exit 77 = skipped: no jinja2; a failure
under CI=true)
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))

CHATML_TOOLS = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nCall a tool with <tool_call></tool_call> tags.<|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

LLAMA3 = r"""{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and tools|length > 0 %}
    {{- "You have these functions:\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- else %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable and message.content is not string %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

MISTRAL = r"""{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""

GEMMA = r"""{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '
' + message['content'] | trim + '<end_of_turn>
' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model
'}}{% endif %}"""

PHI = r"""{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>
' + message['content'] + '<|end|>
'}}{% elif message['role'] == 'user' %}{{'<|user|>
' + message['content'] + '<|end|>
'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>
' + message['content'] + '<|end|>
'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>
' }}{% else %}{{ eos_token }}{% endif %}"""

REASONING = r"""{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == "user" or message.role == "system" %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if '</think>' in message.content %}
            {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
            {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""

# Features one by one: macros, loops, filters, tests, operators, whitespace control.
SOUP = r"""{% macro turn(role, text, sep='\n') -%}
[{{ role | upper }}]{{ sep }}{{ text }}
{%- endmacro %}
{# a comment on its own line #}
{% for m in messages if m.role != 'system' %}
  {{ turn(m.role, m.content | default('(empty)', true)) }}
  {%- if loop.last %} (last of {{ loop.length }}, #{{ loop.index }}/{{ loop.revindex0 }}){% endif %}

{% else %}
no messages
{% endfor %}
{%+ if true %}kept indent{% endif %}
roles: {{ messages | map(attribute='role') | join(', ') }}
users: {{ messages | selectattr('role', 'equalto', 'user') | list | length }}
not users: {{ messages | rejectattr('role', 'eq', 'user') | map(attribute='role') | unique | join('/') }}
math: {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 1 + 2 * 3 - 4 }} {{ (1 + 2) * 3 }}
strings: {{ 'ab' ~ 3 ~ none }} {{ 'x' * 3 }} {{ 'Hello World'[1:5] }} {{ 'abc'[-1] }} {{ 'abc'[::-1] }} {{ '  pad  ' | trim }}|
methods: {{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'Title me'.title() }} {{ 'xAx'.replace('x', 'y') }} {{ 'abc'.upper() }} {{ 'hello'.capitalize() }}
tests: {{ none is none }} {{ 3 is odd }} {{ 4 is even }} {{ 'a' is string }} {{ [1] is sequence }} {{ {} is mapping }} {{ undefined_thing is defined }} {{ 9 is divisibleby 3 }}
in: {{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }}
ternary: {{ 'yes' if messages else 'no' }} {{ 'a' if false }}|
values: {{ [1, 'two', none, true, 2.5] }} {{ {'a': 1, 'b': [1, 2]} }} {{ 1.0 }} {{ 10000000000 }}
json: {{ {'name': 'caf\u00e9 "q"', 'n': [1, 2.5, none, false], 'nested': {'x': {}}} | tojson }}
json indent: {{ {'a': [1, {'b': 'c'}], 'e': []} | tojson(indent=2) }}
items: {% for k, v in {'one': 1, 'two': 2}.items() %}{{ k }}={{ v }}{{ ', ' if not loop.last }}{% endfor %}
get: {{ {'a': 1}.get('a') }} {{ {'a': 1}.get('b', 'dflt') }} {{ {'a': 1}.get('b') }}
ns: {% set ns = namespace(count=0, seen=[]) %}{% for m in messages %}{% set ns.count = ns.count + 1 %}{% endfor %}{{ ns.count }}
scope: {% set outer = 'before' %}{% for m in messages %}{% set outer = 'inside' %}{% endfor %}{{ outer }}
control: {% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 4 %}{% break %}{% endif %}{{ i }}{% endfor %} {{ range(3) | list }} {{ range(1, 10, 3) | join(' ') }}
first/last: {{ messages | first | tojson }} {{ (messages | last).role }} {{ [3, 1, 2] | sort | join }} {{ [3, 1, 2] | reverse | join }} {{ 'abc' | list }}
indent: {{ 'a\nb\nc' | indent(2) }}
"""

CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! How can I help?"},
     {"role": "user", "content": "Tell me a joke.\nA short one.  "}],
    [{"role": "system", "content": ""}, {"role": "user", "content": "  spaces  "},
     {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nAnswer"},
     {"role": "user", "content": "again"}],
    [{"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
         "name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
     {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 18}"},
     {"role": "tool", "tool_call_id": "c2", "content": "sunny"},
     {"role": "assistant", "content": "It is 18 C and sunny."}],
    [{"role": "assistant", "content": "out of order"}],
]

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city, \"now\"",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}]


def skipped(why):
    if os.environ.get("CI", "") not in ("", "0", "false"):
        print(f"FAIL: CI=true and the oracle cannot run: {why}")
        return 1
    print(f"SKIP: {why}")
    return 77


def hf_environment():
    """jinja2 set up as Hugging Face's apply_chat_template sets it up."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def model_template():
    from weft_serve import default_model_path
    path = default_model_path()
    if not os.path.exists(path):
        return None
    try:
        import gguf
    except ImportError:
        return None
    field = gguf.GGUFReader(path).fields.get("tokenizer.chat_template")
    return bytes(field.parts[field.data[0]]).decode() if field else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--render", required=True)
    a = ap.parse_args()
    try:
        import jinja2  # noqa: F401
    except ImportError:
        return skipped("jinja2 is not installed (scripts/setup.sh --test)")
    env = hf_environment()
    templates = {"chatml-tools": CHATML_TOOLS, "llama3": LLAMA3, "mistral": MISTRAL,
                 "gemma": GEMMA, "phi": PHI, "reasoning": REASONING, "soup": SOUP}
    own = model_template()
    if own:
        templates["default-model"] = own
    cases = []
    for name, src in templates.items():
        for ci, conv in enumerate(CONVERSATIONS):
            for gen in (True, False):
                for tools in (None, TOOLS):
                    ctx = {"messages": conv, "add_generation_prompt": gen, "bos_token": "<s>",
                           "eos_token": "</s>", "tools": tools}
                    if name == "reasoning" and ci == 3:
                        ctx["enable_thinking"] = False
                    cases.append((name, ci, gen, tools is not None, src, ctx))
    lines = "".join(json.dumps({"template": c[4], "context": c[5]}) + "\n" for c in cases)
    res = subprocess.run([a.render], input=lines.encode(), capture_output=True, check=True)
    got = [json.loads(x) for x in res.stdout.decode().splitlines()]
    if len(got) != len(cases):
        print(f"FAIL: {len(got)} answers for {len(cases)} cases")
        return 1
    failures = raised = 0
    for (name, ci, gen, tools, src, ctx), out in zip(cases, got):
        try:
            ref, ref_err = env.from_string(src).render(**ctx), None
        except jinja2.exceptions.TemplateError as e:
            ref, ref_err = None, str(e)
        what = f"{name}, conversation {ci}, generation prompt {gen}, tools {tools}"
        if ref_err is not None:
            raised += 1
            if "error" not in out:
                failures += 1
                print(f"MISMATCH {what}: jinja2 raised {ref_err!r}, weft rendered {out.get('text')!r}")
            elif ref_err not in out["error"] and "raise" in src:
                failures += 1
                print(f"MISMATCH {what}: jinja2 raised {ref_err!r}, weft: {out['error']!r}")
        elif "error" in out:
            failures += 1
            print(f"MISMATCH {what}: weft failed: {out['error']}")
        elif out["text"] != ref:
            failures += 1
            print(f"MISMATCH {what}:\n  jinja2: {ref!r}\n  weft:   {out['text']!r}")
    print(f"jinja oracle: {len(cases) - failures}/{len(cases)} renders identical to jinja2 "
          f"{jinja2.__version__} ({len(templates)} templates, {raised} raising in both)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
