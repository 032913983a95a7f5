#!/usr/bin/env python3
"""`weft rl --agents 1 --trainers 2 --netns`: the trainer group's rank 1 on a node in a network
namespace of its own (docs/rl.md, "Trainer groups"), on a tiny generated model:

- undisturbed, in namespaces: the run exits 0 with its steps;
- the trainer node's link cut mid-run for 6 s (longer than the head's dead-after bound and the
  5 s connection timeout), then restored: the rank is declared lost, the group restarts once the
  node is back (the cut node gives up on its head, exits and is relaunched), rank 0 sends the new
  group its weights and moments, and the run exits 0 with every step training its samples and the
  same rewards, losses and final weights as the undisturbed run, bit for bit.

Needs root, iproute2 and nsenter; without them it exits 77, which CTest reports as skipped.

Usage: test_rl_trainer_link_cut.py --weft PATH/TO/weft --make-model PATH/TO/weft_make_tiny_model
"""
import argparse
import os
import re
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support"))
from cli_checks import check, finish, read_jsonl, run_watching, run_weft  # noqa: E402
from rl_runs import (netns_usable, outcome as run_outcome, reward_not_dots,  # noqa: E402
                     set_links, tiny_setup)

STEPS = 24
SAMPLES = 6 * 4
CUT_AT_STEP = 3
CUT_SECONDS = 6.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    ap.add_argument("--make-model", required=True)
    a = ap.parse_args()
    if not netns_usable():
        print("SKIP: trainer nodes in network namespaces need root, iproute2 and nsenter")
        return 77  # CTest reports it as skipped (SKIP_RETURN_CODE), never as passed
    with tempfile.TemporaryDirectory() as tmp:
        model, data, script = tiny_setup(a.make_model, tmp, reward=reward_not_dots(0.02))

        def args(tag):
            return ["--model", model, "--data", data, "--prompt-format", "raw",
                    "--prompts-per-step", "6", "--group-size", "4", "--max-new-tokens", "48",
                    "--eval-prompts", "6", "--eval-every", "12", "--lr", "3e-4", "--seed", "5",
                    "--threads", "1", "--steps", str(STEPS), "--rollout-type", "f16",
                    "--agents", "1", "--trainers", "2", "--netns",
                    "--reward-cmd", f"python3 {script}",
                    "--metrics", os.path.join(tmp, tag + ".jsonl"),
                    "--save", os.path.join(tmp, tag + ".gguf"), "--save-type", "f32"]

        rc, out = run_weft(a.weft, "rl", args("calm"), timeout=500)
        check(rc == 0, f"--trainers 2 --netns: exits 0 (rc {rc}) {out[-600:]}")
        check("network namespaces: 2 node(s)" in out,
              "the agent's and the trainer's nodes run in 2 namespaces")
        if rc != 0:
            return finish()
        want = run_outcome(tmp, "calm")

        pids, cut = {}, {}

        def cut_then_heal(pid):
            try:
                cut["links"] = set_links(pid, False)
                time.sleep(CUT_SECONDS)
            finally:
                set_links(pid, True)

        def on_line(line):
            m = re.search(r"trainer-node-1 started \(pid (\d+)\)", line)
            if m:
                pids["node"] = int(m.group(1))
            if "thread" not in cut and f"step {CUT_AT_STEP}/" in line and "node" in pids:
                cut["thread"] = threading.Thread(target=cut_then_heal, args=(pids["node"],))
                cut["thread"].start()
        rc, out = run_watching([a.weft, "rl"] + args("cut"), on_line, timeout=500)
        if "thread" in cut:
            cut["thread"].join()
        check(rc == 0, f"the trainer node's link cut mid-run: the run exits 0 (rc {rc}) "
                       f"{out[-800:]}")
        check(bool(cut.get("links")), f"the trainer node's links went down ({cut.get('links')}) "
                                      f"and up")
        groups = re.findall(r"trainer group (\d+) formed", out)
        check(len(groups) >= 2, f"the group formed again after the cut ({groups})")
        check("trainer-node-1 relaunched" in out,
              "the cut node gave up on its head and was relaunched once its link was back")
        if rc == 0:
            got = run_outcome(tmp, "cut")
            check(len(got[0]) == STEPS and all(s[1] == SAMPLES for s in got[0]),
                  f"cut: every step trained exactly {SAMPLES} samples")
            check(got == want, "cut: rewards, losses, held-out pass@1 and final weights equal the "
                               "undisturbed run's, bit for bit")
            last = [r for r in read_jsonl(os.path.join(tmp, "cut.jsonl")) if r["kind"] == "step"][-1]
            check(last["trainer_groups"] >= 2,
                  f"cut: the metrics count the groups ({last['trainer_groups']})")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
