#!/usr/bin/env python3
"""`weft rl --agents 1 --trainers 2`: a data-parallel trainer group — rank 0 in the `weft rl`
process, rank 1 on a trainer node under a one-for-all supervisor (docs/rl.md, "Trainer groups") —
on a tiny generated model with f16 rollout weights:

- two runs with --trainers 2 (gradients summed in buckets during the backward, then after it:
  --bucket-mb 0) give the same rewards, losses and weights, bit for bit; --trainers 3
  and --trainers 1 give the same losses up to float rounding (the gradients are summed in another
  order); `weft cluster status --rl` lists the ranks;
- the trainer node SIGKILLed twice mid-run: the group restarts (the supervisor restarts the rank
  on the relaunched node, rank 0 sends it its weights and AdamW moments), the run exits 0 and its
  rewards, losses and weights equal the undisturbed --trainers 2 run's, bit for bit;
- SIGTERM mid-run writes a checkpoint (exit 143); --resume continues with a new group that
  receives the restored state, and the run ends bit-identical to the undisturbed one;
- --trainers 2 --device cpu:0 (each rank's forward and backward on the CPU device, the sum and
  AdamW on the host: --dist-backend auto's choice, as NCCL needs a CUDA GPU per rank) equals the
  host group bit for bit; --bucket-mb > 0 with a device is refused, and so are --dist-backend
  nccl without a CUDA --device and --dist-backend without a group;
- --trainers 2 without --agents is refused.

Usage: test_rl_trainers.py --weft PATH/TO/weft --make-model PATH/TO/weft_make_tiny_model
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support"))
from cli_checks import check, finish, read_jsonl, run_watching, run_weft  # noqa: E402
from rl_runs import (free_port, outcome as run_outcome, reward_not_dots,  # noqa: E402
                     status_asker, tiny_setup)

STEPS = 16
SAMPLES = 6 * 4

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    ap.add_argument("--make-model", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model, data, script = tiny_setup(a.make_model, tmp, reward=reward_not_dots(0.01))

        def args(tag, trainers, extra=()):
            return ["--model", model, "--data", data, "--prompt-format", "raw",
                    "--prompts-per-step", "6", "--group-size", "4", "--max-new-tokens", "48",
                    "--eval-prompts", "6", "--eval-every", "8", "--lr", "3e-4", "--seed", "5",
                    "--threads", "1", "--steps", str(STEPS), "--rollout-type", "f16",
                    "--agents", "1", "--trainers", str(trainers),
                    "--reward-cmd", f"python3 {script}",
                    "--metrics", os.path.join(tmp, tag + ".jsonl"),
                    "--save", os.path.join(tmp, tag + ".gguf"), "--save-type", "f32"] + list(extra)

        def outcome(tag):
            return run_outcome(tmp, tag)

        port = free_port()
        ask_status, status = status_asker(a.weft, port, "step 2/")
        rc, out = run_watching([a.weft, "rl"] + args("two", 2, ["--metrics-port", str(port)]),
                               ask_status, timeout=400)
        check(rc == 0, f"--trainers 2: exits 0 (rc {rc}) {out[-400:]}")
        if rc != 0:
            return finish()
        check("trainer group 1 formed (2 ranks" in out, "the group of 2 ranks formed")
        want = outcome("two")
        check(len(want[0]) == STEPS and any(s[3] != 0 for s in want[0]),
              f"{STEPS} steps, some with a gradient")
        st = status.get("json")
        if st is not None and st.returncode == 0:
            group = json.loads(st.stdout).get("trainers") or {}
            ranks = group.get("ranks", [])
            check(len(ranks) == 1 and ranks[0]["state"] == "ready" and ranks[0]["pid"] > 0,
                  f"weft cluster status --rl lists rank 1 ({ranks})")
            check(group.get("gradient_sum") == "host",
                  f"and says the group sums in host memory ({group.get('gradient_sum')})")
            text = status["table"].stdout
            check("trainer-node-1" in text and "TRAINER RANK" in text and
                  "gradients summed in host memory (UCX)" in text,
                  f"and prints the trainer node, the ranks and where they sum: {text[-400:]}")
        else:
            check(False, f"weft cluster status --rl answered ({st.stderr[-300:] if st else None})")

        # Again, the all-reduce after the backward instead of in buckets during it.
        rc, out = run_weft(a.weft, "rl", args("again", 2, ["--bucket-mb", "0"]), timeout=400)
        check(rc == 0 and outcome("again") == want,
              f"--trainers 2 twice (--bucket-mb 25, then 0): rewards, losses, pass@1 and weights "
              f"equal bit for bit (rc {rc})")

        # On a device (--device cpu:0, a GPU's code path on the CPU device): every rank runs its
        # forward and backward there and adds its gradients into host memory, where the group
        # sums them after the backward and AdamW runs (--dist-backend auto picks that: NCCL
        # needs a CUDA GPU per rank); the CPU device gives the host's bits.
        rc, out = run_weft(a.weft, "rl", args("device", 2, ["--device", "cpu:0"]), timeout=400)
        check(rc == 0, f"--trainers 2 --device cpu:0: exits 0 (rc {rc}) {out[-400:]}")
        check("rank 1 trains on cpu:0" in out, "rank 1 trains on cpu:0")
        check("gradients summed over UCX through host memory: rank 0 keeps its gradients in "
              "host memory" in out, "--dist-backend auto says why the sum is not on the GPUs")
        if rc == 0:
            check(outcome("device") == want, "--trainers 2 --device cpu:0: rewards, losses, "
                                             "pass@1 and weights equal the host group's, bit for bit")
        rc, out = run_weft(a.weft, "rl", args("devbuckets", 2, ["--device", "cpu:0",
                                                                "--bucket-mb", "4"]), timeout=60)
        check(rc == 2 and "--bucket-mb" in out,
              f"--bucket-mb > 0 with --device and --trainers is refused: {out[-200:]}")
        rc, out = run_weft(a.weft, "rl", args("devnccl", 2, ["--device", "cpu:0",
                                                             "--dist-backend", "nccl"]), timeout=60)
        check(rc == 2 and "--dist-backend nccl" in out and "--device cuda" in out,
              f"--dist-backend nccl without a CUDA --device is refused: {out[-200:]}")
        rc, out = run_weft(a.weft, "rl", args("onenccl", 1, ["--dist-backend", "ucx"]), timeout=60)
        check(rc == 2 and "--dist-backend" in out and "--trainers" in out,
              f"--dist-backend without --trainers K > 1 is refused: {out[-200:]}")

        for k in (1, 3):
            rc, out = run_weft(a.weft, "rl", args(f"k{k}", k), timeout=400)
            check(rc == 0, f"--trainers {k}: exits 0 (rc {rc}) {out[-300:]}")
            if rc == 0:
                got = outcome(f"k{k}")
                gap = max(abs(x[3] - y[3]) for x, y in zip(got[0], want[0]))
                check(len(got[0]) == STEPS and gap < 1e-4,
                      f"--trainers {k}: the losses equal --trainers 2's up to rounding "
                      f"(largest gap {gap:.2e})")

        # The trainer node SIGKILLed after steps 3 and 9 (its pid from the launch lines).
        pids, sent = {}, []
        kills = [3, 9]

        def killer(line):
            m = re.search(r"trainer-node-1 (?:started \(pid|relaunched \(pid) (\d+)\)", line)
            if m:
                pids["node"] = int(m.group(1))
            m = re.search(r"step (\d+)/", line)
            if m and kills and int(m.group(1)) >= kills[0] and "node" in pids:
                kills.pop(0)
                try:
                    os.kill(pids["node"], signal.SIGKILL)
                    sent.append(pids.pop("node"))
                except ProcessLookupError:
                    pass
        # Buckets of 10 KiB: many of them in flight when the node dies.
        rc, out = run_watching([a.weft, "rl"] + args("killed", 2, ["--bucket-mb", "0.01"]), killer,
                               timeout=600)
        check(rc == 0, f"trainer node SIGKILLed twice: the run exits 0 (rc {rc}) {out[-600:]}")
        check(len(sent) == 2, f"two trainer node processes were killed ({sent})")
        groups = re.findall(r"trainer group (\d+) formed", out)
        check(len(groups) >= 3, f"the group formed again after each kill ({groups})")
        if rc == 0:
            last = [r for r in read_jsonl(os.path.join(tmp, "killed.jsonl"))
                    if r["kind"] == "step"][-1]
            check(last["trainer_groups"] >= 3,
                  f"the metrics count the groups ({last['trainer_groups']})")
            got = outcome("killed")
            check(all(s[1] == SAMPLES for s in got[0]) and got == want,
                  "killed: every step trained its samples; rewards, losses, pass@1 and weights "
                  "equal the undisturbed run's, bit for bit")

        # SIGTERM mid-run: rank 0 writes a checkpoint and the run exits 143; --resume brings up
        # a new group that receives the restored state, and the run ends as the undisturbed one.
        ck = os.path.join(tmp, "ck")
        p = subprocess.Popen([a.weft, "rl"] + args("resumed", 2, ["--checkpoint-dir", ck,
                                                                  "--checkpoint-every", "100"]),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen = ""
        while "step 6/" not in seen:
            line = p.stdout.readline()
            if not line:
                break
            seen += line
        p.send_signal(signal.SIGTERM)
        rest, _ = p.communicate(timeout=300)
        check(p.returncode == 143, f"SIGTERM: a checkpoint, exit 143 (rc {p.returncode}) "
                                   f"{rest[-300:]}")
        rc, out = run_weft(a.weft, "rl", args("resumed", 2, ["--checkpoint-dir", ck, "--resume"]),
                           timeout=400)
        check(rc == 0 and "resumed from" in out and "trainer group 1 formed" in out,
              f"--resume with the group: exits 0 (rc {rc}) {out[-300:]}")
        if rc == 0:
            check(outcome("resumed") == want, "stopped and resumed: rewards, losses, pass@1 and "
                                              "weights equal the undisturbed run's, bit for bit")

        rc, out = run_weft(a.weft, "rl", ["--model", model, "--data", data, "--reward-cmd",
                                          f"python3 {script}", "--trainers", "2"], timeout=60)
        check(rc == 2 and "--trainers" in out,
              f"--trainers 2 without --agents is refused: {out[-200:]}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
