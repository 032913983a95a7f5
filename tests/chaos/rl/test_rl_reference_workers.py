#!/usr/bin/env python3
"""`weft rl --agents 1 --kl-coef B --reference-workers K`: the KL reference runs on nodes of the
run's cluster, as supervised reference workers (docs/rl.md, "KL to the reference"), on a tiny
generated model with f16 rollout weights:

- fused into generation (the finished groups' calls made from a thread of the loop while the
  rollouts go on, several groups a call when they finish together; `--blocking-reference`: one
  group a call, waited for) with 2 workers, and in the training stage
  (--no-fused-reference, several micro-batches per call spread over the workers): the rewards,
  losses, KL and final weights equal a run whose reference lives in the `weft rl` process, bit for
  bit; `weft cluster status --rl` lists both workers and their nodes;
- with --device cpu:0 (a GPU's code path on the CPU device) the workers load the reference on the
  run's device and equal the in-process reference on it, bit for bit;
- the only reference node SIGKILLed mid-run, twice: the run waits for the relaunched node and its
  restarted worker, exits 0, and is still bit-identical; the metrics count the lost workers;
- --reference-workers without --kl-coef, or without --agents, is refused.

Usage: test_rl_reference_workers.py --weft PATH/TO/weft --make-model PATH/TO/weft_make_tiny_model
"""
import argparse
import json
import os
import re
import signal
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support"))
from cli_checks import check, finish, read_jsonl, run_watching, run_weft  # noqa: E402
from rl_runs import free_port, outcome as run_outcome, status_asker, tiny_setup  # noqa: E402

STEPS = 8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    ap.add_argument("--make-model", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model, data, script = tiny_setup(a.make_model, tmp)

        def args(tag, extra=(), kl="0.2"):
            return ["--model", model, "--data", data, "--prompt-format", "raw",
                    "--prompts-per-step", "6", "--group-size", "4", "--max-new-tokens", "48",
                    "--eval-prompts", "6", "--eval-every", "4", "--lr", "3e-4", "--seed", "5",
                    "--threads", "1", "--steps", str(STEPS), "--rollout-type", "f16",
                    "--agents", "1", "--reward-cmd", f"python3 {script}", "--kl-coef", kl,
                    "--metrics", os.path.join(tmp, tag + ".jsonl"),
                    "--save", os.path.join(tmp, tag + ".gguf"), "--save-type", "f32"] + list(extra)

        def outcome(tag):
            steps, evals, weights = run_outcome(tmp, tag)
            kl = [r["kl"] for r in read_jsonl(os.path.join(tmp, tag + ".jsonl"))
                  if r["kind"] == "step"]
            return steps, evals, weights, kl

        rc, out = run_weft(a.weft, "rl", args("local"), timeout=400)
        check(rc == 0, f"the reference in the weft rl process: exits 0 (rc {rc}) {out[-300:]}")
        if rc != 0:
            return finish()
        want = outcome("local")
        check(len(want[0]) == STEPS and any(k > 0 for k in want[3]),
              f"{STEPS} steps, with a nonzero KL after the first ({want[3]})")

        # Two workers, fused: one batch per finished group.
        port = free_port()
        ask, status = status_asker(a.weft, port, "step 1/")
        rc, out = run_watching([a.weft, "rl"] + args("workers", ["--reference-workers", "2",
                                                                 "--metrics-port", str(port)]),
                               ask, timeout=400)
        check(rc == 0, f"--reference-workers 2: exits 0 (rc {rc}) {out[-300:]}")
        check("reference worker 0 ready" in out and "reference worker 1 ready" in out,
              "both reference workers loaded the model and said hello")
        if rc == 0:
            check(outcome("workers") == want, "--reference-workers 2: rewards, losses, KL, pass@1 "
                                              "and weights equal the in-process reference's, bit "
                                              "for bit")
        st = status.get("json")
        if st is not None and st.returncode == 0:
            j = json.loads(st.stdout)
            workers = (j.get("reference") or {}).get("workers", [])
            check(len(workers) == 2 and all(w["state"] == "ready" and w["pid"] > 0
                                            for w in workers),
                  f"weft cluster status --rl lists both reference workers ({workers})")
            check(sum(w["batches"] for w in workers) > 0, f"and the batches they computed")
            check(sum(n["id"].startswith("reference-node-") for n in j["cluster"]["nodes"]) == 2,
                  "and their nodes")
            table = status.get("table")
            check(table is not None and "KL REFERENCE" in table.stdout,
                  "the status table has a KL REFERENCE section")
        else:
            check(False, f"weft cluster status --rl answered ({st.stderr[-300:] if st else None})")

        # The blocking baseline: the loop waits for each group's call; the same bits.
        rc, out = run_weft(a.weft, "rl", args("blocking", ["--reference-workers", "2",
                                                           "--blocking-reference"]), timeout=400)
        check(rc == 0, f"--blocking-reference: exits 0 (rc {rc}) {out[-300:]}")
        if rc == 0:
            check(outcome("blocking") == want, "--blocking-reference: the same bits")
            rows = [r for r in read_jsonl(os.path.join(tmp, "blocking.jsonl")) if r["kind"] == "step"]
            check(all(r["ref_wait_s"] >= 0.99 * r["ref_s"] > 0 for r in rows),
                  "--blocking-reference: every step waited for all of its reference calls")
        rc, out = run_weft(a.weft, "rl", args("nobr", ["--blocking-reference"]), timeout=60)
        check(rc == 2 and "--blocking-reference" in out,
              f"--blocking-reference without --reference-workers is refused: {out[-200:]}")

        # In the training stage: the update's micro-batches, several per call, over two workers.
        extra = ["--no-fused-reference", "--micro-batch-tokens", "128"]
        rc, out = run_weft(a.weft, "rl", args("unfused", extra), timeout=400)
        check(rc == 0, f"--no-fused-reference in process: exits 0 (rc {rc}) {out[-300:]}")
        rc2, out = run_weft(a.weft, "rl", args("unfused-workers", extra +
                                               ["--reference-workers", "2"]), timeout=400)
        check(rc2 == 0, f"--no-fused-reference --reference-workers 2: exits 0 (rc {rc2}) "
                        f"{out[-300:]}")
        if rc == 0 and rc2 == 0:
            check(outcome("unfused-workers") == outcome("unfused"),
                  "--no-fused-reference: the workers give the in-process reference's bits")

        # On a device (--device cpu:0: the code path of a GPU, run on the CPU device): the workers
        # open the run's --device and give the in-process reference's bits on it.
        dev = ["--device", "cpu:0"]
        rc, out = run_weft(a.weft, "rl", args("device", dev), timeout=400)
        check(rc == 0, f"--device cpu:0 in process: exits 0 (rc {rc}) {out[-300:]}")
        rc2, out = run_weft(a.weft, "rl", args("device-workers", dev +
                                               ["--reference-workers", "1"]), timeout=400)
        check(rc2 == 0, f"--device cpu:0 --reference-workers 1: exits 0 (rc {rc2}) {out[-300:]}")
        check("threads, on cpu:0)" in out, "the worker loaded the reference on cpu:0")
        if rc == 0 and rc2 == 0:
            check(outcome("device-workers") == outcome("device"),
                  "--device cpu:0: the workers give the in-process reference's bits")

        # The only reference node SIGKILLed at steps 2 and 5: calls wait for its relaunch.
        kills = {}

        def killer(line):
            m = re.search(r"reference-node-0 (?:started|relaunched) \(pid (\d+)\)", line)
            if m:
                kills["pid"] = int(m.group(1))
            for at in ("step 2/", "step 5/"):
                if at in line and at not in kills and "pid" in kills:
                    kills[at] = kills["pid"]
                    os.kill(kills["pid"], signal.SIGKILL)
        rc, out = run_watching([a.weft, "rl"] + args("killed", ["--reference-workers", "1"]),
                               killer, timeout=400)
        check(rc == 0, f"the reference node SIGKILLed twice: the run exits 0 (rc {rc}) "
                       f"{out[-600:]}")
        check("step 2/" in kills and "step 5/" in kills and
              len(re.findall(r"reference-node-0 exited", out)) >= 2,
              f"the node was killed twice ({kills})")
        check(out.count("reference worker 0 ready") >= 3,
              "the worker was restarted on the relaunched node each time")
        if rc == 0:
            last = [r for r in read_jsonl(os.path.join(tmp, "killed.jsonl"))
                    if r["kind"] == "step"][-1]
            check(last["reference_workers_lost"] >= 2,
                  f"the metrics count the lost workers ({last['reference_workers_lost']})")
            check(outcome("killed") == want, "killed: rewards, losses, KL, pass@1 and weights "
                                             "equal the undisturbed run's, bit for bit")

        rc, out = run_weft(a.weft, "rl", args("nokl", ["--reference-workers", "1"], kl="0"),
                           timeout=60)
        check(rc == 2 and "--reference-workers" in out,
              f"--reference-workers without --kl-coef is refused: {out[-200:]}")
        rc, out = run_weft(a.weft, "rl", ["--model", model, "--data", data, "--kl-coef", "0.1",
                                          "--reference-workers", "1"], timeout=60)
        check(rc == 2 and "--reference-workers" in out,
              f"--reference-workers without --agents is refused: {out[-200:]}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
