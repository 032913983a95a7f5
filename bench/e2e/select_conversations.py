#!/usr/bin/env python3
"""Cuts a Mooncake trace down to whole conversations, so that a short replay still shows prefix
reuse: a conversation is the requests sharing their first two hash blocks; the earliest ones with
at least --min-turns turns are kept (all their turns, trace order, original timestamps) until
--requests. Prints the fraction of prompt blocks that repeat an earlier request's leading blocks.

Usage: select_conversations.py TRACE.jsonl OUT.jsonl [--requests 40] [--min-turns 3]
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--min-turns", type=int, default=3)
    a = ap.parse_args()
    rows = [json.loads(line) for line in open(a.trace) if line.strip()]
    chains = {}
    for i, r in enumerate(rows):
        h = r.get("hash_ids", [])
        if len(h) >= 2:
            chains.setdefault((h[0], h[1]), []).append(i)
    picked = []
    for turns in sorted((v for v in chains.values() if len(v) >= a.min_turns), key=lambda v: v[0]):
        if len(picked) + len(turns) > a.requests * 1.2:
            continue
        picked += turns
        if len(picked) >= a.requests:
            break
    picked.sort()
    seen, shared, total = set(), 0, 0
    with open(a.out, "w") as f:
        for i in picked:
            h = rows[i]["hash_ids"]
            k = 0
            while k < len(h) and h[k] in seen:
                k += 1
            shared, total = shared + k, total + len(h)
            seen.update(h)
            f.write(json.dumps(rows[i]) + "\n")
    print("selected %d requests of %d conversations; %.0f%% of prompt blocks repeat an earlier prefix" %
          (len(picked), sum(1 for v in chains.values() if len(v) >= a.min_turns and v[0] in picked),
           100.0 * shared / max(total, 1)))


if __name__ == "__main__":
    main()
