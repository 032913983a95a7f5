#!/usr/bin/env python3
"""Structured outputs against an independent validator: for a corpus of JSON Schemas, random outputs
drawn through weft's grammar token mask (tests/support/grammar_sample.cpp) must all parse and
validate with Python's `jsonschema`; schemas with keywords the grammar cannot enforce are refused
with a message naming the keyword. Exit 77 (skipped) without the jsonschema package."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

try:
    import jsonschema
except ImportError:
    print("jsonschema is not installed: skipped")
    sys.exit(77)

CORPUS = {
    "flat_required": {"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "ok": {"type": "boolean"}},
        "required": ["name", "age", "ok"]},
    "optional_only": {"type": "object", "properties": {
        "a": {"type": "number"}, "b": {"type": "null"}, "c": {"type": "string", "maxLength": 3}}},
    "mixed_optional": {"type": "object", "properties": {
        "id": {"type": "integer"}, "note": {"type": "string"}, "score": {"type": "number"}},
        "required": ["score"], "additionalProperties": False},
    "enums_heavy": {"type": "object", "properties": {
        "colour": {"enum": ["red", "green", "blue", "dark \"violet\""]},
        "size": {"enum": [1, 2, 3.5, None, True]},
        "kind": {"const": "fixed"}}, "required": ["colour", "size", "kind"]},
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 8},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
            "required": ["name", "tags"]},
        "points": {"type": "array", "items": {"type": "array", "items": {"type": "integer"},
                                               "minItems": 2, "maxItems": 2},
                   "minItems": 1, "maxItems": 4}},
        "required": ["user", "points"]},
    "any_of_and_types": {"type": "object", "properties": {
        "v": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 4}]},
        "w": {"type": ["number", "null"]},
        "x": {"oneOf": [{"type": "object", "properties": {"k": {"const": 1}}, "required": ["k"]},
                        {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}]}},
        "required": ["v", "w", "x"]},
    "refs_recursive": {"$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer"},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["value"]}},
        "$ref": "#/$defs/node"},
    "prefix_items": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}],
                     "items": False, "minItems": 2},
    "top_level_array": {"type": "array", "items": {"type": "object", "properties": {
        "q": {"type": "boolean"}}, "required": ["q"]}, "minItems": 1, "maxItems": 3},
    "any_json": {},
}

REFUSED = {
    "pattern": {"type": "string", "pattern": "^[a-z]+$"},
    "minimum": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3}}},
    "uniqueItems": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
    "format": {"type": "string", "format": "date-time"},
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sampler", required=True, help="weft_grammar_sample")
    ap.add_argument("--n", type=int, default=40)
    a = ap.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, schema in CORPUS.items():
            path = os.path.join(tmp, name + ".json")
            json.dump(schema, open(path, "w"))
            validator = jsonschema.Draft202012Validator(schema)
            total = 0
            for seed in (1, 2):
                p = subprocess.run([a.sampler, path, str(a.n), str(seed)], capture_output=True,
                                   text=True, timeout=300)
                if p.returncode != 0:
                    print(f"FAIL {name}: sampler exit {p.returncode}: {p.stderr.strip()[:400]}")
                    failures += 1
                    continue
                lines = p.stdout.splitlines()
                if len(lines) != a.n:
                    print(f"FAIL {name}: {len(lines)} outputs, expected {a.n}")
                    failures += 1
                for line in lines:
                    try:
                        doc = json.loads(line)
                    except json.JSONDecodeError as e:
                        print(f"FAIL {name}: output does not parse ({e}): {line!r}")
                        failures += 1
                        continue
                    errs = list(validator.iter_errors(doc))
                    if errs:
                        print(f"FAIL {name}: {errs[0].message}: {line!r}")
                        failures += 1
                    total += 1
            print(f"ok   {name}: {total} outputs validate, e.g. {lines[0] if lines else ''}")
        for keyword, schema in REFUSED.items():
            path = os.path.join(tmp, "refused.json")
            json.dump(schema, open(path, "w"))
            p = subprocess.run([a.sampler, path, "1", "1"], capture_output=True, text=True)
            if p.returncode != 2 or f"'{keyword}'" not in p.stderr:
                print(f"FAIL refused {keyword}: exit {p.returncode}, {p.stderr.strip()!r}")
                failures += 1
            else:
                print(f"ok   refused {keyword}: {p.stderr.strip()}")
    print("FAILED" if failures else "all schemas: every output validates")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
