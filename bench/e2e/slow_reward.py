#!/usr/bin/env python3
"""A `weft rl --reward-cmd` program that takes its time, as a judge model or a code sandbox does:
each sample is scored after --ms-per-sample milliseconds. The score is the built-in arithmetic
verifier's: 1 when the last integer in the completion is the answer, else 0.

Protocol (docs/rl.md, "Rewards from your own program"): one JSON line per sample on stdin,
{"id", "prompt", "completion", "answer"}; one {"id", "reward"} line per sample on stdout.
Usage: weft rl ... --reward-cmd "python3 bench/e2e/slow_reward.py --ms-per-sample 50"
"""
import argparse
import json
import re
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ms-per-sample", type=float, default=50.0)
    a = ap.parse_args()
    for line in sys.stdin:
        r = json.loads(line)
        time.sleep(a.ms_per_sample / 1000.0)
        numbers = re.findall(r"-?\d+", r["completion"])
        ok = bool(numbers) and str(int(numbers[-1])) == r["answer"]
        print(json.dumps({"id": r["id"], "reward": 1.0 if ok else 0.0}), flush=True)


if __name__ == "__main__":
    main()
