#!/usr/bin/env python3
"""`weft rl --agents 2 --netns`: each rollout agent's node process in a network namespace of its
own, reaching the controller (and its peer) over a bridge (docs/rl.md, "Rollout agents"), on a
tiny generated model with f16 rollout weights (bit-exact whatever the batch):

- undisturbed, in namespaces: `weft cluster status --rl URL` shows the run's private cluster (the
  head and both agent nodes on their bridge addresses) and both agents ready;
- agent 0's link cut mid-run (its namespace's interface down for 6 s, longer than the head's
  dead-after bound and the 5 s connection timeout), then restored: the agent is restarted on the
  live node and its rollouts move (replayed: the text held back from the dead agent's last
  delta, half a UTF-8 character, is not lost), the cut node gives up on its head and is
  relaunched once the link is back, and the run still exits 0 with every step training exactly
  its samples and the same rewards, losses and final weights as the undisturbed run, bit for bit.

Needs root, iproute2 and nsenter; without them it exits 77, which CTest reports as skipped.

Usage: test_rl_link_cut.py --weft PATH/TO/weft --make-model PATH/TO/weft_make_tiny_model
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support"))
from cli_checks import check, finish, read_jsonl, run_watching  # noqa: E402
from rl_runs import (free_port, netns_usable, outcome as run_outcome, set_links,  # noqa: E402
                     tiny_setup)

# Long enough that the run outlasts the cut node's exit and relaunch: on an idle 2-vCPU host the
# node loses its head ~5 s into the 6 s cut, takes up to 5 s to stop, and 40 steps ended ~4.5 s
# after it lost the head (the relaunch came after the run).
STEPS = 80
SAMPLES = 8 * 4
CUT_AT_STEP = 2
CUT_SECONDS = 6.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    ap.add_argument("--make-model", required=True)
    a = ap.parse_args()
    if not netns_usable():
        print("SKIP: rollout agents in network namespaces need root, iproute2 and nsenter")
        return 77  # CTest reports it as skipped (SKIP_RETURN_CODE), never as passed
    with tempfile.TemporaryDirectory() as tmp:
        model, data, script = tiny_setup(a.make_model, tmp)

        def args(tag, extra=()):
            return ["--model", model, "--data", data, "--prompt-format", "raw",
                    "--prompts-per-step", "8", "--group-size", "4", "--max-new-tokens", "192",
                    "--eval-prompts", "8", "--eval-every", "10", "--lr", "3e-4", "--seed", "5",
                    "--threads", "1", "--steps", str(STEPS), "--rollout-type", "f16",
                    "--agents", "2", "--netns", "--reward-cmd", f"python3 {script}",
                    "--metrics", os.path.join(tmp, tag + ".jsonl"),
                    "--save", os.path.join(tmp, tag + ".gguf"), "--save-type", "f32"] + list(extra)

        def outcome(tag):
            return run_outcome(tmp, tag)

        # 1. Undisturbed, with `weft cluster status --rl` asked while it runs.
        port = free_port()
        status = {}

        def ask_status(line):
            if "status" in status or "step 1/" not in line:
                return
            url = f"http://127.0.0.1:{port}"
            status["table"] = subprocess.run([a.weft, "cluster", "status", "--rl", url],
                                             capture_output=True, text=True, timeout=30)
            status["json"] = subprocess.run([a.weft, "cluster", "status", "--rl", url, "--json"],
                                            capture_output=True, text=True, timeout=30)
            status["status"] = True
        rc, out = run_watching([a.weft, "rl"] + args("calm", ["--metrics-port", str(port)]),
                               ask_status, timeout=500)
        check(rc == 0, f"--agents 2 --netns: exits 0 (rc {rc}) {out[-600:]}")
        check("network namespaces: 2 node(s)" in out, "the agents' nodes run in 2 namespaces")
        if rc != 0:
            return finish()
        want = outcome("calm")
        check(len(want[0]) == STEPS and all(s[1] == SAMPLES for s in want[0]) and
              any(s[3] != 0 for s in want[0]),
              f"undisturbed: {STEPS} steps of {SAMPLES} samples, some with a gradient")
        table = status.get("table")
        check(table is not None and table.returncode == 0,
              f"weft cluster status --rl answers ({table.stderr[-300:] if table else 'not asked'})")
        if table is not None and table.returncode == 0:
            print(table.stdout)
            j = json.loads(status["json"].stdout)
            nodes = j["cluster"]["nodes"]
            agents = j["rl"]["agents"]
            check(sum(n["id"].startswith("rollout-node-") and n["address"].startswith("10.213.")
                      for n in nodes) == 2,
                  f"the status lists both agent nodes on their bridge addresses "
                  f"({[(n['id'], n['address']) for n in nodes]})")
            check(len(agents) == 2 and all(x["state"] == "ready" and x["pid"] > 0 for x in agents),
                  f"the status lists both agents ready, with their pids ({agents})")
            check("AGENT" in table.stdout and "rollout-node-0" in table.stdout,
                  "the table shows the nodes and the agents")

        # 2. Agent 0's link cut once step CUT_AT_STEP is done, restored CUT_SECONDS later.
        pids, cut = {}, {}

        def cut_then_heal(pid):
            try:
                cut["links"] = set_links(pid, False)
                cut["at"] = time.time()
                time.sleep(CUT_SECONDS)
            finally:
                set_links(pid, True)
                cut["healed"] = time.time()

        def on_line(line):
            m = re.search(r"rollout-node-(\d+) started \(pid (\d+)\)", line)
            if m:
                pids[int(m.group(1))] = int(m.group(2))
            if "thread" not in cut and f"step {CUT_AT_STEP}/" in line and 0 in pids:
                cut["thread"] = threading.Thread(target=cut_then_heal, args=(pids[0],))
                cut["thread"].start()
        rc, out = run_watching([a.weft, "rl"] + args("cut"), on_line, timeout=500)
        if "thread" in cut:
            cut["thread"].join()
        check(rc == 0, f"an agent's link cut mid-run: the run exits 0 (rc {rc}) {out[-800:]}")
        check(bool(cut.get("links")), f"agent 0's links went down ({cut.get('links')}) and up")
        moved = [int(m) for m in re.findall(r"lost \(.*?\): (\d+) rollouts move", out)]
        check(len(moved) >= 1, f"the controller declared the cut agent lost and moved its "
                               f"rollouts ({moved})")
        check("rollout agent 0 joined" in out,
              "agent 0 was restarted (its supervisor placed it on a live node) and joined again")
        check("rollout-node-0 relaunched" in out,
              "the cut node gave up on its head and was relaunched once its link was back")
        if rc == 0:
            got = outcome("cut")
            check(len(got[0]) == STEPS and all(s[1] == SAMPLES for s in got[0]),
                  f"cut: every step trained exactly {SAMPLES} samples")
            check(got[0] == want[0], "cut: rewards and losses of every step equal the "
                                     "undisturbed run's, bit for bit")
            check(got[1] == want[1], "cut: held-out pass@1 equals the undisturbed run's")
            check(got[2] == want[2], "cut: final weights equal the undisturbed run's")
            last = [r for r in read_jsonl(os.path.join(tmp, "cut.jsonl")) if r["kind"] == "step"][-1]
            check(last["agents_lost"] >= 1 and last["rollouts_moved"] >= sum(moved),
                  f"cut: the metrics count the lost agent and the moved rollouts "
                  f"({last['agents_lost']}, {last['rollouts_moved']})")
        # Nothing of the run's network is left behind.
        tags = re.findall(r"on bridge wb(\d+)", out)
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        check(len(tags) == 1 and f"weft{tags[0]}n" not in left,
              f"the run's namespaces are removed at its end ({tags}; {left.strip()[:200]})")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
