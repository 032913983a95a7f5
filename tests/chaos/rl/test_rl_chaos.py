#!/usr/bin/env python3
"""`weft rl` with its reward process under faults, on a tiny generated model, in sync mode and in
async mode (K = 2):

- undisturbed: the reference run (rewards from an external Python process);
- SIGKILL of the reward process three times mid-run: each time it is restarted, the unanswered
  samples are sent again, and the run's rewards and losses per step and its final weights (the
  exported f32 GGUF) are bit-identical to the reference;
- SIGSTOP of the reward process (a hang): after --reward-timeout-s it is killed and restarted, with
  the same bit-identical outcome;
- the same with two copies of the program (--reward-procs 2, async): one of them is killed or
  stopped; the run equals the one-copy run bit for bit;
- a reward process that dies on every batch: the run ends with exit 1 after --reward-restarts
  restarts and says why, instead of training on missing rewards.

Usage: test_rl_chaos.py --weft PATH/TO/weft --make-model PATH/TO/weft_make_tiny_model
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support"))
from cli_checks import check, finish, read_jsonl, run_watching, run_weft  # noqa: E402

STEPS = 30

REWARD = """import json, os, sys
with open(sys.argv[1], "a") as f:
    f.write(f"{os.getpid()}\\n")
for line in sys.stdin:
    r = json.loads(line)
    print(json.dumps({"id": r["id"], "reward": float("..." in r["completion"])}), flush=True)
"""


def current_pid(pidfile, signalled=()):
    """The newest reward process not signalled yet (with --reward-procs, a killed copy may not
    have been restarted when the next fault comes: the other copy is hit then)."""
    try:
        pids = [int(p) for p in open(pidfile).read().split()]
    except OSError:
        return None
    live = [p for p in pids if p not in signalled]
    return live[-1] if live else None


def disturbed(weft, args, pidfile, faults):
    """Runs `weft rl ARGS` and sends each (step, signal) of `faults` to the reward process once the
    progress line of that step has been printed. Returns (exit status, output, faults sent)."""
    sent = []
    pending = list(faults)

    def on_line(line):
        if pending and f"step {pending[0][0]}/" in line:
            step, sig = pending.pop(0)
            pid = current_pid(pidfile, [p for _, _, p in sent])
            if pid is not None:
                try:
                    os.kill(pid, sig)
                    sent.append((step, sig, pid))
                except ProcessLookupError:
                    pass
    rc, out = run_watching([weft, "rl"] + args, on_line)
    for _, sig, pid in sent:  # never leave a stopped process behind
        if sig == signal.SIGSTOP:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return rc, out, sent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    ap.add_argument("--make-model", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "tiny.gguf")
        subprocess.run([a.make_model, model], check=True)
        data = os.path.join(tmp, "prompts.jsonl")
        with open(data, "w") as f:
            for i in range(60):
                f.write(f'{{"prompt": "Say three dots ({i}).", "answer": "..."}}\n')
        script = os.path.join(tmp, "reward.py")
        with open(script, "w") as f:
            f.write(REWARD)

        def args(tag, mode, pidfile, extra=()):
            return ["--model", model, "--data", data, "--prompt-format", "raw",
                    "--prompts-per-step", "4", "--group-size", "4", "--max-new-tokens", "8",
                    "--eval-prompts", "8", "--eval-every", "10", "--lr", "1e-3", "--seed", "3",
                    "--threads", "2", "--steps", str(STEPS), "--reward-cmd",
                    f"python3 {script} {pidfile}", "--reward-timeout-s", "3",
                    "--metrics", os.path.join(tmp, tag + ".jsonl"),
                    "--save", os.path.join(tmp, tag + ".gguf"), "--save-type", "f32"] + \
                mode + list(extra)

        def outcome(tag):
            rows = read_jsonl(os.path.join(tmp, tag + ".jsonl"))
            steps = [(r["step"], r["samples"], r["reward"], r["loss"]) for r in rows
                     if r["kind"] == "step"]
            evals = [(r["step"], r["pass_at_1"]) for r in rows if r["kind"] == "eval"]
            return steps, evals, open(os.path.join(tmp, tag + ".gguf"), "rb").read()

        wants = {}
        for name, mode in [("sync", []), ("async", ["--mode", "async", "--max-staleness", "2"]),
                           ("async-2copies", ["--mode", "async", "--max-staleness", "2",
                                                       "--reward-procs", "2"])]:
            ref = name + "-ref"
            pids = os.path.join(tmp, ref + ".pids")
            rc, out = run_weft(a.weft, "rl", args(ref, mode, pids), timeout=400)
            check(rc == 0, f"{name}: undisturbed run exits 0 (rc {rc}) {out[-300:]}")
            if rc != 0:
                continue
            want = wants[name] = outcome(ref)
            if "--reward-procs" in mode and "async" in wants:
                check(want == wants["async"], f"{name}: the run of one reward process, bit for bit")
            check(len(want[0]) == STEPS and all(s[1] == 16 for s in want[0]) and
                  any(s[2] > 0 for s in want[0]), f"{name}: {STEPS} steps of 16 scored samples")

            tag = name + "-kill"
            pids = os.path.join(tmp, tag + ".pids")
            faults = [(5, signal.SIGKILL), (12, signal.SIGKILL), (20, signal.SIGKILL)]
            rc, out, sent = disturbed(a.weft, args(tag, mode, pids), pids, faults)
            check(rc == 0, f"{name}: run with the reward process SIGKILLed exits 0 (rc {rc}) "
                           f"{out[-400:]}")
            check(len(sent) == 3 and out.count("restarting it") >= 3,
                  f"{name}: 3 kills sent and 3 restarts reported ({len(sent)} sent)")
            restarted = len(open(pids).read().split()) if os.path.exists(pids) else 0
            copies = 2 if "--reward-procs" in mode else 1
            check(restarted >= 3 + copies, f"{name}: the reward processes were started {restarted} times")
            steps = [r for r in read_jsonl(os.path.join(tmp, tag + ".jsonl")) if r["kind"] == "step"] \
                if rc == 0 else []
            check(steps and steps[-1]["reward_restarts"] >= 3,
                  f"{name}: the metrics count the restarts "
                  f"({steps[-1]['reward_restarts'] if steps else None})")
            if rc == 0:
                got = outcome(tag)
                check(got[0] == want[0], f"{name}: rewards and losses of every step equal the "
                                         "undisturbed run's, bit for bit")
                check(got[1] == want[1], f"{name}: held-out pass@1 equals the undisturbed run's")
                check(got[2] == want[2], f"{name}: final weights equal the undisturbed run's")

            tag = name + "-stop"
            pids = os.path.join(tmp, tag + ".pids")
            t0 = time.time()
            rc, out, sent = disturbed(a.weft, args(tag, mode, pids), pids, [(8, signal.SIGSTOP)])
            check(rc == 0 and len(sent) == 1 and "restarting it" in out,
                  f"{name}: a hung (SIGSTOPped) reward process is restarted after the timeout "
                  f"(rc {rc}, {time.time() - t0:.1f} s) {out[-300:]}")
            if rc == 0:
                got = outcome(tag)
                check(got[0] == want[0] and got[2] == want[2],
                      f"{name}: after the hang, rewards, losses and weights are bit-identical")

        # A reward process that dies on every batch: a clear failure, not training on nothing.
        dying = os.path.join(tmp, "dying.py")
        with open(dying, "w") as f:
            f.write("import sys\nsys.stdin.readline()\nsys.exit(3)\n")
        rc, out = run_weft(a.weft, "rl", ["--model", model, "--data", data, "--prompt-format",
                                          "raw", "--prompts-per-step", "2", "--group-size", "2",
                                          "--max-new-tokens", "4", "--eval-every", "0",
                                          "--steps", "3", "--reward-cmd", f"python3 {dying}",
                                          "--reward-restarts", "2", "--metrics",
                                          os.path.join(tmp, "dying.jsonl")], timeout=120)
        check(rc == 1 and "reward" in out and "restart" in out,
              f"a reward process that always dies ends the run with exit 1: {out[-300:]}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
