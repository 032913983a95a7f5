#!/usr/bin/env python3
"""`weft rl --agents 2 --consolidate-tail N` (docs/rl.md, "Tail consolidation"): once a step's
unfinished rollouts fit on half of the agents holding them, at most N an agent, the others' move
there (aborted where they ran, replayed with their tokens so far) and the freed agents are free.

A tiny generated model, briefly fine-tuned on 2-digit additions so that some samples stop after a
few tokens and others run to the length cap (a long tail), served as f16 rollout weights (the
engine's f16 path gives the same bits whatever else is in the batch, so a moved rollout continues
bit for bit):

- sync: a run with consolidation gives the run without it bit for bit (rewards and losses of every
  step, held-out pass@1, final weights), and its metrics count the moved rollouts;
- --mode stream: the same, against stream without consolidation;
- --mode async --max-staleness 1: every step trains exactly its samples within the bound;
- without --agents the option is refused.

Usage: test_rl_consolidate.py --weft PATH/TO/weft --make-model PATH/TO/weft_make_tiny_model
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "support"))
from cli_checks import check, finish, read_jsonl, run_or_exit, run_weft  # noqa: E402
from rl_runs import outcome  # noqa: E402

STEPS = 10
SAMPLES = 8 * 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    ap.add_argument("--make-model", required=True)
    a = ap.parse_args()
    w = a.weft
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "base.gguf")
        run_or_exit([a.make_model, base, "--layers", "4", "--embd", "128"])
        task = ["--digits", "2", "--prompt-format", "raw"]
        sft = os.path.join(tmp, "sft.jsonl")
        run_or_exit([w, "rl", "--model", base] + task + ["--seed", "0", "--write-sft-data", sft,
                                                         "--sft-examples", "3000"])
        # Six steps: the model has learnt to stop, but not always (a long tail).
        model = os.path.join(tmp, "warm.gguf")
        run_or_exit([w, "train", "--model", base, "--data", sft, "--steps", "6", "--lr", "3e-3",
                     "--save", model])

        def args(tag, extra=()):
            return ["--model", model] + task + [
                "--seed", "5", "--prompts-per-step", "8", "--group-size", "4",
                "--max-new-tokens", "96", "--steps", str(STEPS), "--eval-prompts", "8",
                "--eval-every", "5", "--lr", "3e-4", "--threads", "1", "--rollout-type", "f16",
                "--agents", "2", "--metrics", os.path.join(tmp, tag + ".jsonl"),
                "--save", os.path.join(tmp, tag + ".gguf"), "--save-type", "f32"] + list(extra)

        def steps(tag):
            return [r for r in read_jsonl(os.path.join(tmp, tag + ".jsonl")) if r["kind"] == "step"]

        for mode in (["--mode", "sync"], ["--mode", "stream"]):
            name = mode[1]
            rc, out = run_weft(w, "rl", args(name, mode), timeout=400)
            check(rc == 0, f"{name}: exits 0 (rc {rc}) {out[-300:]}")
            rc2, out2 = run_weft(w, "rl", args(name + "-cons", mode + ["--consolidate-tail", "8"]),
                                 timeout=400)
            check(rc2 == 0, f"{name} --consolidate-tail 8: exits 0 (rc {rc2}) {out2[-300:]}")
            if rc != 0 or rc2 != 0:
                continue
            rows = steps(name)
            stopped = [r["stopped_fraction"] for r in rows]
            check(all(0.0 < s < 1.0 for s in stopped),
                  f"{name}: the warm start stops some samples early, not all (a tail: {stopped})")
            want, got = outcome(tmp, name), outcome(tmp, name + "-cons")
            check(len(got[0]) == STEPS and all(s[1] == SAMPLES for s in got[0]),
                  f"{name} consolidated: every step trained exactly {SAMPLES} samples")
            check(got[0] == want[0], f"{name} consolidated: rewards and losses of every step "
                                     "equal the run without consolidation, bit for bit")
            check(got[1] == want[1], f"{name} consolidated: held-out pass@1 equals the other run's")
            check(got[2] == want[2], f"{name} consolidated: final weights equal the other run's")
            last = steps(name + "-cons")[-1]
            moves = out2.count("tail consolidation:")
            check(last["rollouts_consolidated"] > 0 and last["consolidations"] > 0 and moves > 0,
                  f"{name} consolidated: rollouts moved off an agent ({last['consolidations']} "
                  f"times, {last['rollouts_consolidated']} rollouts; {moves} log lines)")
            check(steps(name)[-1]["rollouts_consolidated"] == 0,
                  f"{name} without the option: nothing consolidated")

        rc, out = run_weft(w, "rl", args("async", ["--mode", "async", "--max-staleness", "1",
                                                   "--consolidate-tail", "8"]), timeout=400)
        check(rc == 0, f"async --consolidate-tail 8: exits 0 (rc {rc}) {out[-300:]}")
        if rc == 0:
            rows = steps("async")
            check(len(rows) == STEPS and all(r["samples"] == SAMPLES for r in rows) and
                  all(r["staleness_max"] <= 1 for r in rows),
                  "async consolidated: every step trained its samples within the staleness bound")

        rc, out = run_weft(w, "rl", ["--model", model, "--consolidate-tail", "4", "--steps", "1"],
                           timeout=60)
        check(rc == 2 and "need --agents" in out,
              f"--consolidate-tail without --agents is refused: {out[-200:]}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
