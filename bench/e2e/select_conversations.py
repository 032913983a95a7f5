#!/usr/bin/env python3
"""Cuts a Mooncake trace down to whole conversations, so that a short replay still shows prefix
reuse: a conversation is the requests sharing their first two hash blocks; the earliest ones with
at least --min-turns turns are kept (all their turns, trace order, original timestamps) until
--requests. With --spread the conversations are instead taken at even intervals over the whole
trace (every k-th by start time), so that they start one after another as in the live system the
trace was recorded from, not all in the first seconds (the trace opens with the conversations that
were already under way, a burst). Prints the fraction of prompt blocks that repeat an earlier
request's leading blocks.

Usage: select_conversations.py TRACE.jsonl OUT.jsonl [--requests 40] [--min-turns 3] [--spread]
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--min-turns", type=int, default=3)
    ap.add_argument("--spread", action="store_true",
                    help="take conversations at even intervals over the trace instead of the earliest")
    a = ap.parse_args()
    rows = [json.loads(line) for line in open(a.trace) if line.strip()]
    chains = {}
    for i, r in enumerate(rows):
        h = r.get("hash_ids", [])
        if len(h) >= 2:
            chains.setdefault((h[0], h[1]), []).append(i)
    candidates = sorted((v for v in chains.values() if len(v) >= a.min_turns), key=lambda v: v[0])
    if a.spread and candidates:
        mean_turns = sum(len(v) for v in candidates) / len(candidates)
        stride = max(1, int(len(candidates) * mean_turns / a.requests))
        candidates = candidates[::stride]
    picked = []
    for turns in candidates:
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
