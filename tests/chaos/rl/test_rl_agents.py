#!/usr/bin/env python3
"""`weft rl --agents 2`: rollout agents in their own `weft node` processes (docs/rl.md, "Rollout
agents"), on a tiny generated model with f16 rollout weights (the engine's f16 path gives the same
bits whatever else is in the batch, so a moved rollout continues bit for bit):

- the agents give the in-process engine's run bit for bit: rewards and losses of every step,
  held-out pass@1, the final weights;
- a rollout agent's node process SIGKILLed mid-rollouts, twice: the run exits 0, every step trains
  exactly its samples, the rollouts the dead agent held move to the other agent (replaying their
  tokens) and the result is still bit-identical to the undisturbed run; the killed node is
  relaunched and its agent restarted, pulling the current weight version from its live peer;
- --mode stream with agents: repeatable bit for bit, unchanged by a killed agent, and its first
  update equals sync's up to rounding;
- --mode async --max-staleness 2 with agents: the staleness bound holds for every step;
- --agents 3 --weight-fanout 1: each weight version leaves the controller once and goes on from
  agent to agent, the run unchanged bit for bit (also with a link of the chain SIGKILLed);
  without it every agent pulls from the controller (the metrics count both);
- an agent that cannot start (a device its node does not have) ends the run at once, naming it;
- options of the agents without --agents are refused.

Usage: test_rl_agents.py --weft PATH/TO/weft --make-model PATH/TO/weft_make_tiny_model
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support"))
from cli_checks import check, finish, read_jsonl, run_watching, run_weft  # noqa: E402
from rl_runs import outcome as run_outcome, tiny_setup  # noqa: E402

STEPS = 12
SAMPLES = 8 * 4



def killed_run(weft, args, kills):
    """Runs `weft rl ARGS`; once the progress line of step s has been printed, SIGKILLs the node
    process of rollout agent a, for each (s, a) of `kills`. Returns (exit status, output, kills)."""
    sent, pids = [], {}
    pending = list(kills)

    def on_line(line):
        m = re.search(r"rollout-node-(\d+) started \(pid (\d+)\)", line)
        if m:
            pids[int(m.group(1))] = int(m.group(2))
        if pending and f"step {pending[0][0]}/" in line:
            step, agent = pending.pop(0)
            try:
                os.kill(pids[agent], signal.SIGKILL)
                sent.append((step, agent, pids[agent]))
            except (KeyError, ProcessLookupError):
                pass
    rc, out = run_watching([weft, "rl"] + args, on_line)
    return rc, out, sent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    ap.add_argument("--make-model", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model, data, script = tiny_setup(a.make_model, tmp)

        def args(tag, extra=()):
            return ["--model", model, "--data", data, "--prompt-format", "raw",
                    "--prompts-per-step", "8", "--group-size", "4", "--max-new-tokens", "192",
                    "--eval-prompts", "8", "--eval-every", "6", "--lr", "3e-4", "--seed", "5",
                    "--threads", "1", "--steps", str(STEPS), "--rollout-type", "f16",
                    "--reward-cmd", f"python3 {script}",
                    "--metrics", os.path.join(tmp, tag + ".jsonl"),
                    "--save", os.path.join(tmp, tag + ".gguf"), "--save-type", "f32"] + list(extra)

        def outcome(tag):
            return run_outcome(tmp, tag)

        rc, out = run_weft(a.weft, "rl", args("local"), timeout=400)
        check(rc == 0, f"in-process engine: exits 0 (rc {rc}) {out[-300:]}")
        if rc != 0:
            return finish()
        want = outcome("local")
        check(len(want[0]) == STEPS and all(s[1] == SAMPLES for s in want[0]) and
              any(s[3] != 0 for s in want[0]),
              f"in-process: {STEPS} steps of {SAMPLES} samples, some with a gradient")

        rc, out = run_weft(a.weft, "rl", args("agents", ["--agents", "2"]), timeout=400)
        check(rc == 0, f"--agents 2: exits 0 (rc {rc}) {out[-300:]}")
        check("rollout agent 0 ready" in out and "rollout agent 1 ready" in out,
              "--agents 2: both agents said hello and hold the weights")
        if rc == 0:
            got = outcome("agents")
            check(got[0] == want[0], "--agents 2: rewards and losses of every step equal the "
                                     "in-process engine's, bit for bit")
            check(got[1] == want[1], "--agents 2: held-out pass@1 equals the in-process run's")
            check(got[2] == want[2], "--agents 2: final weights equal the in-process run's")

        rc, out, sent = killed_run(a.weft, args("killed", ["--agents", "2"]), [(3, 0), (7, 1)])
        check(rc == 0, f"agents SIGKILLed mid-run: the run exits 0 (rc {rc}) {out[-600:]}")
        check(len(sent) == 2, f"2 agent node processes were killed ({sent})")
        moved = [int(m) for m in re.findall(r"lost \(.*?\): (\d+) rollouts move", out)]
        check(len(moved) >= 2 and sum(moved) > 0,
              f"the dead agents' rollouts moved to the live one ({moved})")
        # The first killed agent is back well before the second kill (its node is relaunched,
        # its supervisor restarts it after 1.5 s); the second may rejoin after the last step.
        check(out.count("sending weight version") >= 1,
              "a restarted agent joined again and was offered the current weights")
        check(len(re.findall(r"pulls weight version \d+ from rollout agent \d", out)) >= 1,
              "the restarted agent pulled the current version from its live peer")
        if rc == 0:
            got = outcome("killed")
            check(len(got[0]) == STEPS and all(s[1] == SAMPLES for s in got[0]),
                  f"killed: every step trained exactly {SAMPLES} samples")
            check(got[0] == want[0], "killed: rewards and losses of every step equal the "
                                     "undisturbed run's, bit for bit")
            check(got[2] == want[2], "killed: final weights equal the undisturbed run's")
            last = [r for r in read_jsonl(os.path.join(tmp, "killed.jsonl"))
                    if r["kind"] == "step"][-1]
            check(last["agents_lost"] == 2 and last["rollouts_moved"] == sum(moved) and
                  last["peer_weight_pulls"] >= 1 and last["agents_ready"] >= 1,
                  f"killed: the metrics count the lost agents, moved rollouts and peer pulls "
                  f"({last['agents_lost']}, {last['rollouts_moved']}, {last['peer_weight_pulls']},"
                  f" {last['agents_ready']} ready)")

        # --weight-fanout 1 with 3 agents: each version leaves the controller once and goes on
        # from agent to agent (a chain); the run is the same bit for bit. Then agent 1 — a link
        # of the chain — is SIGKILLed: the pulls it served fail over, and the run is unchanged.
        rc, out = run_weft(a.weft, "rl", args("fanout", ["--agents", "3", "--weight-fanout", "1"]),
                           timeout=400)
        check(rc == 0, f"--agents 3 --weight-fanout 1: exits 0 (rc {rc}) {out[-300:]}")
        if rc == 0:
            got = outcome("fanout")
            check(got[0] == want[0] and got[2] == want[2], "--weight-fanout 1: rewards, losses "
                  "and final weights equal the in-process run's, bit for bit")
            rows = [r for r in read_jsonl(os.path.join(tmp, "fanout.jsonl"))
                    if r["kind"] == "step"]
            last = rows[-1]
            # One version a step (the last step's is published too): once from the controller,
            # twice from a peer.
            check(last["controller_weight_pulls"] == STEPS and
                  last["peer_weight_pulls"] == 2 * STEPS,
                  f"--weight-fanout 1: {STEPS} pulls from the controller and {2 * STEPS} from "
                  f"peers ({last['controller_weight_pulls']}, {last['peer_weight_pulls']})")
        rc, out = run_weft(a.weft, "rl", args("fanout_default", ["--agents", "3"]), timeout=400)
        if rc == 0:
            last = [r for r in read_jsonl(os.path.join(tmp, "fanout_default.jsonl"))
                    if r["kind"] == "step"][-1]
            check(last["controller_weight_pulls"] == 3 * STEPS and last["peer_weight_pulls"] == 0,
                  f"without --weight-fanout every agent pulls from the controller "
                  f"({last['controller_weight_pulls']}, {last['peer_weight_pulls']})")
        else:
            check(False, f"--agents 3: exits 0 (rc {rc}) {out[-300:]}")
        rc, out, sent = killed_run(a.weft, args("fanout_killed", ["--agents", "3",
                                                                  "--weight-fanout", "1"]),
                                   [(4, 1)])
        check(rc == 0 and len(sent) == 1,
              f"--weight-fanout 1, agent 1 SIGKILLed: the run exits 0 (rc {rc}, {sent}) "
              f"{out[-600:]}")
        if rc == 0:
            got = outcome("fanout_killed")
            check(got[0] == want[0] and got[2] == want[2], "--weight-fanout 1, agent killed: "
                  "rewards, losses and final weights equal the undisturbed run's, bit for bit")

        # --mode stream: groups train as they are scored, in group order — repeatable bit for bit,
        # a kill changes nothing, and the update equals sync's up to the summation order.
        rc, out = run_weft(a.weft, "rl", args("stream", ["--agents", "2", "--mode", "stream"]),
                           timeout=400)
        check(rc == 0, f"--agents 2 --mode stream: exits 0 (rc {rc}) {out[-300:]}")
        rc2, out2, sent = killed_run(a.weft, args("stream-killed", ["--agents", "2", "--mode",
                                                                    "stream"]), [(4, 1)])
        check(rc2 == 0 and len(sent) == 1,
              f"stream with an agent SIGKILLed: exits 0 (rc {rc2}) {out2[-300:]}")
        if rc == 0 and rc2 == 0:
            got, again = outcome("stream"), outcome("stream-killed")
            check(len(got[0]) == STEPS and all(s[1] == SAMPLES for s in got[0]),
                  f"stream: every step trained exactly {SAMPLES} samples")
            check(again[0] == got[0] and again[2] == got[2],
                  "stream: a run with an agent killed gives the same losses and weights, bit "
                  "for bit")
            s1, w1 = got[0][0], want[0][0]
            check(s1[2] == w1[2] and abs(s1[3] - w1[3]) <= 1e-3 * max(abs(w1[3]), 1e-6),
                  f"stream: step 1 has sync's samples and its loss up to rounding ({s1} vs {w1})")

        rc, out = run_weft(a.weft, "rl", args("async", ["--agents", "2", "--mode", "async",
                                                        "--max-staleness", "2"]), timeout=400)
        check(rc == 0, f"--agents 2 --mode async: exits 0 (rc {rc}) {out[-300:]}")
        if rc == 0:
            rows = [r for r in read_jsonl(os.path.join(tmp, "async.jsonl")) if r["kind"] == "step"]
            check(len(rows) == STEPS and all(r["samples"] == SAMPLES for r in rows) and
                  all(r["staleness_max"] <= 2 for r in rows),
                  "async with agents: every step trained its samples within the staleness bound")

        # Agents that cannot start (a device no node has) end the run at once with the reason,
        # not after the supervisor's restarts and the start timeout.
        rc, out = run_weft(a.weft, "rl", ["--model", model, "--agents", "1",
                                          "--rollout-device", "cuda:99", "--steps", "1"],
                           timeout=60)
        check(rc == 1 and "rollout agent 0:" in out and "cuda:99" in out.split("rollout agent 0:")[-1],
              f"an agent that cannot open its device ends the run with its error: {out[-400:]}")

        rc, out = run_weft(a.weft, "rl", ["--model", model, "--data", data, "--dispatch",
                                          "round-robin", "--steps", "1"], timeout=60)
        check(rc == 2 and "need --agents" in out,
              f"--dispatch without --agents is refused: {out[-200:]}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
