#!/usr/bin/env python3
"""`weft rl --agents 1 --reward-workers 2`: the user's reward program runs on two nodes of the run's
cluster, as supervised reward workers (docs/rl.md, "Rewards from your own program"), on a tiny
generated model with f16 rollout weights:

- the rewards, losses and final weights equal a run whose reward program runs beside the trainer,
  bit for bit; `weft cluster status --rl` lists both reward workers;
- a reward node SIGKILLed twice mid-run while it holds a part (the program kills its own node at
  its 60th and 150th sample): the run exits 0, the lost worker's part is scored again by the
  other, the node is relaunched and its worker restarted, and the results are still bit-identical;
- `--reward-workers 1 --reward-procs 2`: two copies of the program on the reward node score the
  parts split between them, at the same time, and the run is still bit-identical;
- a reward program that answers garbage ends the run with an error naming the sample;
- --reward-workers without --agents or without --reward-cmd is refused.

Usage: test_rl_reward_workers.py --weft PATH/TO/weft --make-model PATH/TO/weft_make_tiny_model
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support"))
from cli_checks import check, finish, read_jsonl, run_watching, run_weft  # noqa: E402
from rl_runs import free_port, outcome as run_outcome, tiny_setup  # noqa: E402

STEPS = 8
SAMPLES = 6 * 4

# 20 ms a sample, so that both workers have parts in flight.
REWARD = """import json, sys, time
for line in sys.stdin:
    r = json.loads(line)
    c = r["completion"]
    time.sleep(0.02)
    print(json.dumps({"id": r["id"], "reward": sum(ch != "." for ch in c) / max(1, len(c))}),
          flush=True)
"""

# The same rewards; in addition, the 60th and the 150th sample any worker reads (counted across
# processes in a file) make that worker SIGKILL its own node process before answering: the node
# dies while the controller waits for the part.
KILLER = """import fcntl, json, os, signal, sys, time
COUNT = sys.argv[1]
for line in sys.stdin:
    with open(COUNT, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        n = len(f.read()) + 1
        f.write(".")
    if n in (60, 150):
        pid = os.getppid()  # the node process: the nearest ancestor that is `weft`
        while pid > 1 and open(f"/proc/{pid}/comm").read().strip() != "weft":
            pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        os.kill(pid, signal.SIGKILL)
        time.sleep(5)
    r = json.loads(line)
    c = r["completion"]
    time.sleep(0.02)
    print(json.dumps({"id": r["id"], "reward": sum(ch != "." for ch in c) / max(1, len(c))}),
          flush=True)
"""

# The same rewards; each line also appends "pid start end" (seconds) to the file named first.
LOGGED = """import json, os, sys, time
LOG = sys.argv[1]
for line in sys.stdin:
    t0 = time.time()
    r = json.loads(line)
    c = r["completion"]
    time.sleep(0.02)
    with open(LOG, "a") as f:
        f.write(f"{os.getpid()} {t0} {time.time()}\\n")
    print(json.dumps({"id": r["id"], "reward": sum(ch != "." for ch in c) / max(1, len(c))}),
          flush=True)
"""

GARBAGE = """import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(json.dumps({"id": r["id"], "reward": "lots"}), flush=True)
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    ap.add_argument("--make-model", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model, data, script = tiny_setup(a.make_model, tmp, reward=REWARD)
        killer = os.path.join(tmp, "killer.py")
        with open(killer, "w") as f:
            f.write(KILLER)
        garbage = os.path.join(tmp, "garbage.py")
        with open(garbage, "w") as f:
            f.write(GARBAGE)
        logged = os.path.join(tmp, "logged.py")
        with open(logged, "w") as f:
            f.write(LOGGED)

        def args(tag, extra=(), reward=script, reward_args=""):
            return ["--model", model, "--data", data, "--prompt-format", "raw",
                    "--prompts-per-step", "6", "--group-size", "4", "--max-new-tokens", "48",
                    "--eval-prompts", "6", "--eval-every", "4", "--lr", "3e-4", "--seed", "5",
                    "--threads", "1", "--steps", str(STEPS), "--rollout-type", "f16",
                    "--agents", "1", "--reward-cmd", f"python3 {reward} {reward_args}".strip(),
                    "--metrics", os.path.join(tmp, tag + ".jsonl"),
                    "--save", os.path.join(tmp, tag + ".gguf"), "--save-type", "f32"] + list(extra)

        def outcome(tag):
            return run_outcome(tmp, tag)

        rc, out = run_weft(a.weft, "rl", args("local"), timeout=400)
        check(rc == 0, f"the reward program beside the trainer: exits 0 (rc {rc}) {out[-300:]}")
        if rc != 0:
            return finish()
        want = outcome("local")
        check(len(want[0]) == STEPS and any(s[3] != 0 for s in want[0]),
              f"{STEPS} steps, some with a gradient")

        port = free_port()
        status = {}

        def ask_status(line):
            if "status" in status or "step 2/" not in line:
                return
            status["status"] = subprocess.run(
                [a.weft, "cluster", "status", "--rl", f"http://127.0.0.1:{port}", "--json"],
                capture_output=True, text=True, timeout=30)
        rc, out = run_watching([a.weft, "rl"] + args("workers", ["--reward-workers", "2",
                                                                 "--metrics-port", str(port)]),
                               ask_status, timeout=400)
        check(rc == 0, f"--reward-workers 2: exits 0 (rc {rc}) {out[-300:]}")
        check("reward worker 0 ready" in out and "reward worker 1 ready" in out,
              "both reward workers said hello")
        if rc == 0:
            got = outcome("workers")
            check(got == want, "--reward-workers 2: rewards, losses, pass@1 and weights equal the "
                               "local reward program's, bit for bit")
        st = status.get("status")
        if st is not None and st.returncode == 0:
            j = json.loads(st.stdout)
            workers = (j.get("rewards") or {}).get("workers", [])
            check(len(workers) == 2 and all(w["state"] == "ready" and w["pid"] > 0 for w in workers),
                  f"weft cluster status --rl lists both reward workers ({workers})")
            check(sum(n["id"].startswith("reward-node-") for n in j["cluster"]["nodes"]) == 2,
                  "and their nodes")
        else:
            check(False, f"weft cluster status --rl answered ({st.stderr[-300:] if st else None})")

        # Each reward node SIGKILLed once, mid-run, while it holds a part (see KILLER).
        rc, out = run_weft(a.weft, "rl", args("killed", ["--reward-workers", "2"], reward=killer,
                                              reward_args=os.path.join(tmp, "count")),
                           timeout=400)
        check(rc == 0, f"reward nodes SIGKILLed mid-run: the run exits 0 (rc {rc}) {out[-600:]}")
        lost = [int(x) for x in re.findall(r"reward worker \d lost \(.*?\): (\d+) part", out)]
        # The second kill hits whichever node the 150th sample's worker runs on (a restarted worker
        # may have been placed on the other node).
        deaths = re.findall(r"reward-node-\d exited", out)
        check(len(lost) >= 2 and len(deaths) >= 2,
              f"two reward node processes died ({deaths}) and the controller lost their workers "
              f"({lost})")
        check(sum(lost) > 0, f"parts a dead worker held were scored again by the other ({lost})")
        check(out.count("reward worker 0 ready") >= 2 or out.count("reward worker 1 ready") >= 2,
              "a killed worker was restarted and said hello again")
        if rc == 0:
            last = [r for r in read_jsonl(os.path.join(tmp, "killed.jsonl")) if r["kind"] == "step"][-1]
            check(last["reward_workers_lost"] >= 2 and last["reward_parts_rescored"] == sum(lost),
                  f"the metrics count the lost workers and re-scored parts "
                  f"({last['reward_workers_lost']}, {last['reward_parts_rescored']})")
            got = outcome("killed")
            check(all(s[1] == SAMPLES for s in got[0]) and got == want,
                  "killed: every step trained its samples; rewards, losses, pass@1 and weights "
                  "equal the undisturbed run's, bit for bit")

        # Two copies on one reward node: its parts are split over them.
        log = os.path.join(tmp, "copies.log")
        rc, out = run_weft(a.weft, "rl", args("copies", ["--reward-workers", "1", "--reward-procs",
                                                         "2"], reward=logged, reward_args=log),
                           timeout=400)
        check(rc == 0 and "(2 copies)" in out,
              f"--reward-workers 1 --reward-procs 2: exits 0 (rc {rc}) {out[-300:]}")
        if rc == 0:
            check(outcome("copies") == want, "two copies on a reward node: rewards, losses, pass@1 "
                                             "and weights equal the local program's, bit for bit")
            spans = {}
            with open(log) as f:
                for line in f:
                    pid, t0, t1 = line.split()
                    spans.setdefault(pid, []).append((float(t0), float(t1)))
            lines = sum(len(v) for v in spans.values())
            overlap = len(spans) == 2 and any(
                s0 < e1 and s1 < e0 for s0, e0 in list(spans.values())[0]
                for s1, e1 in list(spans.values())[1])
            check(len(spans) == 2 and overlap,
                  f"both copies scored ({ {p: len(v) for p, v in spans.items()} } of {lines} "
                  f"lines), at the same time ({overlap})")

        rc, out = run_weft(a.weft, "rl", args("garbage", ["--reward-workers", "2"],
                                              reward=garbage), timeout=200)
        check(rc != 0 and "reward worker" in out and "sample" in out and "lots" in out,
              f"a garbage reward ends the run naming the sample (rc {rc}): {out[-400:]}")

        rc, out = run_weft(a.weft, "rl", ["--model", model, "--data", data, "--reward-cmd",
                                          f"python3 {script}", "--reward-workers", "2"], timeout=60)
        check(rc == 2 and "--reward-workers" in out, f"--reward-workers without --agents is "
                                                     f"refused: {out[-200:]}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
