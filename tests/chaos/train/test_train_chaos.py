#!/usr/bin/env python3
"""A data-parallel trainer group (`weft train --trainers 2`) under faults, on a tiny generated model:

- undisturbed: the reference run (and its loss curve tracks a one-process run within 1e-3);
- SIGKILL of one trainer node mid-run, then of the other after the group restarted: the group
  restarts from the last checkpoint each time and the final weights (the exported f32 GGUF) and the
  loss curve are bit-identical to the undisturbed run — which sums its gradients after the backward
  (`--bucket-mb 0`), while the disturbed runs sum them in small buckets during it (kills land with
  buckets in flight);
- SIGTERM to `weft train`: every rank stops after the same step, a checkpoint is written, exit 143;
  `--resume` then finishes bit-identical to the undisturbed run;
- a failure a restart cannot fix (a checkpoint of another run under --resume) ends the run with
  exit 1 and the reason, instead of restarting forever; bad data is refused before any process
  starts.

Usage: test_train_chaos.py --weft PATH/TO/weft --make-model PATH/TO/weft_make_tiny_model
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

FAILURES = []
STEPS = 80


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def metrics(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def curve(path):
    """(step, loss, lr, grad_norm, tokens) per line: what must be identical between runs."""
    return [(m["step"], m["loss"], m["lr"], m["grad_norm"], m["tokens"]) for m in metrics(path)
            if "kind" not in m]


def evals(path):
    """(step, eval_loss, eval_tokens) of the --eval-data lines."""
    return [(m["step"], m["eval_loss"], m["eval_tokens"]) for m in metrics(path)
            if m.get("kind") == "eval"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_pid(driver, node_id):
    """The pid of the driver's child `weft node --node-id node_id`, or None."""
    out = subprocess.run(["pgrep", "-P", str(driver.pid), "-f", "--", "--node-id " + node_id],
                         capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else None


class run:
    """`weft train` in the background; its stderr collected line by line."""

    def __init__(self, weft, args):
        self.p = subprocess.Popen([weft, "train"] + args, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        self.lines = []
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line)

    def wait_for(self, text, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if any(text in l for l in self.lines):
                return True
            if self.p.poll() is not None:
                time.sleep(0.2)
                return any(text in l for l in self.lines)
            time.sleep(0.02)
        return False

    def finish(self, timeout=300):
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = self.p.wait()
        self.t.join(timeout=5)
        return rc, "".join(self.lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    ap.add_argument("--make-model", required=True)
    a = ap.parse_args()
    weft = a.weft
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "mid.gguf")
        subprocess.run([a.make_model, model, "--layers", "4", "--embd", "256"], check=True,
                       capture_output=True)
        data = os.path.join(tmp, "train.jsonl")
        with open(data, "w") as f:
            for i in range(400):
                x, y = i % 97, (i * 31) % 89
                f.write(json.dumps({"prompt": f"What is {x} plus {y}? Answer.",
                                    "completion": f"{x} plus {y} is {x + y}."}) + "\n")
        held_out = os.path.join(tmp, "eval.jsonl")
        with open(held_out, "w") as f:
            for i in range(24):
                x, y = (i * 7) % 89, (i * 13) % 97
                f.write(json.dumps({"prompt": f"What is {x} plus {y}? Answer.",
                                    "completion": f"{x} plus {y} is {x + y}."}) + "\n")
        with_eval = ["--eval-data", held_out, "--eval-every", "20"]
        base = ["--model", model, "--data", data, "--batch-tokens", "1024",
                "--micro-batch-tokens", "256", "--lr", "1e-3", "--warmup-steps", "2", "--seed", "3",
                "--steps", str(STEPS), "--threads", "1", "--checkpoint-every", "5",
                "--save-type", "f32", "--allreduce-timeout-ms", "10000"]

        def args_for(d, trainers=2):
            return base + ["--trainers", str(trainers), "--checkpoint-dir", d,
                           "--save", os.path.join(d, "out.gguf")]

        # The reference: undisturbed, and one process for comparison.
        ref = os.path.join(tmp, "ref")
        rc, out = run(weft, args_for(ref) + ["--bucket-mb", "0"] + with_eval).finish()
        check(rc == 0, f"undisturbed group run exits 0 (rc {rc}): {out[-600:]}")
        check("trainer group 1 formed (2 ranks)" in out, "the group of 2 ranks formed")
        ref_bytes = open(os.path.join(ref, "out.gguf"), "rb").read()
        ref_curve = curve(os.path.join(ref, "metrics.jsonl"))
        check([c[0] for c in ref_curve] == list(range(1, STEPS + 1)),
              "the metrics hold every step once")
        one = os.path.join(tmp, "one")
        rc, out = run(weft, args_for(one, trainers=1)).finish()
        one_curve = curve(os.path.join(one, "metrics.jsonl"))
        worst = max(abs(x[1] - y[1]) / max(abs(y[1]), 1e-9) for x, y in zip(ref_curve, one_curve))
        check(rc == 0 and len(one_curve) == STEPS and worst < 1e-3,
              f"2 ranks track 1 process: worst relative loss gap {worst:.2e} over {STEPS} steps")

        # SIGKILL one trainer node, then the other once the group restarted.
        kill = os.path.join(tmp, "kill")
        port = free_port()
        r = run(weft, args_for(kill) + ["--metrics-port", str(port), "--bucket-mb", "0.25"] +
                with_eval)
        check(r.wait_for(f"step 15/{STEPS}"), "the run reaches step 15")
        # `weft cluster status --train` shows the group's private cluster.
        st = subprocess.run([weft, "cluster", "status", "--train", f"http://127.0.0.1:{port}",
                             "--json"], capture_output=True, text=True, timeout=30)
        nodes = json.loads(st.stdout)["cluster"]["nodes"] if st.returncode == 0 else []
        check(sorted(n["id"] for n in nodes if n["id"].startswith("trainer-node-")) ==
              ["trainer-node-0", "trainer-node-1"] and
              all(n["state"] == "alive" for n in nodes),
              f"weft cluster status --train lists both trainer nodes alive ({st.stderr[-200:]} "
              f"{[(n['id'], n['state']) for n in nodes]})")
        pid1 = node_pid(r.p, "trainer-node-1")
        check(pid1 is not None, "trainer-node-1 found")
        if pid1:
            os.kill(pid1, signal.SIGKILL)
        check(r.wait_for("trainer group 2 formed"), "the group restarts after the kill")
        check(r.wait_for("the group continues after step"), "from a checkpoint")
        check(r.wait_for(f"step 35/{STEPS}"), "and goes on")
        pid0 = node_pid(r.p, "trainer-node-0")
        if pid0:
            os.kill(pid0, signal.SIGKILL)
        check(r.wait_for("trainer group 3 formed"), "the group restarts after the second kill")
        rc, out = r.finish()
        check(rc == 0, f"the killed run finishes with exit 0 (rc {rc}): {out[-600:]}")
        got = os.path.join(kill, "out.gguf")
        check(os.path.exists(got) and open(got, "rb").read() == ref_bytes,
              "final weights bit-identical to the undisturbed run")
        check(curve(os.path.join(kill, "metrics.jsonl")) == ref_curve,
              "loss curve identical (every step once, same values)")
        # --eval-data: the restarted groups evaluate where the undisturbed one did, with the same
        # bits (and once more where each continued); every step's evaluation once.
        ref_evals, kill_evals = evals(os.path.join(ref, "metrics.jsonl")), \
            evals(os.path.join(kill, "metrics.jsonl"))
        kept = [e for e in kill_evals if e[0] % 20 == 0]
        check([e[0] for e in ref_evals] == [0, 20, 40, 60, 80] and kept == ref_evals and
              len({e[0] for e in kill_evals}) == len(kill_evals),
              f"held-out evaluations survive the kills bit for bit ({ref_evals} vs {kill_evals})")

        # SIGTERM: checkpoint, exit 143, resume exact.
        term = os.path.join(tmp, "term")
        r = run(weft, args_for(term))
        check(r.wait_for(f"step 12/{STEPS}"), "the run reaches step 12")
        r.p.send_signal(signal.SIGTERM)
        rc, out = r.finish()
        check(rc == 143, f"SIGTERM: exit 143 (rc {rc}): {out[-400:]}")
        check("stopped after step" in out and "--resume" in out, "it says where it stopped")
        stopped = [int(l.split("stopped after step ")[1].split()[0]) for l in out.splitlines()
                   if "stopped after step " in l]
        check(bool(stopped) and os.path.exists(os.path.join(term, f"step-{stopped[0]:08d}.ckpt")),
              "a checkpoint of the step it stopped after")
        rc, out = run(weft, args_for(term) + ["--resume"]).finish()
        check(rc == 0, f"resume exits 0 (rc {rc}): {out[-400:]}")
        check(open(os.path.join(term, "out.gguf"), "rb").read() == ref_bytes,
              "stopped + resumed: weights bit-identical to the undisturbed run")
        check(curve(os.path.join(term, "metrics.jsonl")) == ref_curve,
              "stopped + resumed: loss curve identical")

        # Fatal: a checkpoint of another run (seed) under --resume ends the run, no restart loop.
        t0 = time.time()
        other_seed = [("4" if prev == "--seed" else x)
                      for prev, x in zip([""] + args_for(ref), args_for(ref))]
        rc, out = run(weft, other_seed + ["--resume"]).finish(120)
        check(rc == 1 and "seed" in out and "fatal" in out,
              f"a checkpoint of another seed: exit 1 naming the seed ({rc}): {out[-300:]}")
        check(time.time() - t0 < 60, "without restarting again and again")

        # Bad data: refused before any node starts.
        bad = os.path.join(tmp, "bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"prompt": "a", "completion": "b"}\n{oops\n')
        rc, out = run(weft, ["--model", model, "--data", bad, "--trainers", "2"]).finish(60)
        check(rc == 2 and "bad.jsonl:2" in out and "trainer-node" not in out,
              f"bad data refused by line before any process starts (rc {rc})")
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed", flush=True)
        return 1
    print("all checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
