#!/usr/bin/env python3
"""`weft train` as a new user runs it, on a tiny generated model: --help, bad data refused by line,
a run with checkpoints / metrics / export, a stopped-and-resumed run bit-identical to a straight one,
SIGTERM writing a checkpoint and the resume continuing from it, a checkpoint already at --steps,
--config, and the exported GGUF served by `weft generate`.

Usage: test_train_cli.py --weft PATH/TO/weft --make-model PATH/TO/weft_make_tiny_model
"""
import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "support"))
from cli_checks import check, finish, read_jsonl as metrics, run_weft  # noqa: E402


def train(weft, args, timeout=300):
    return run_weft(weft, "train", args, timeout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    ap.add_argument("--make-model", required=True)
    a = ap.parse_args()
    weft = a.weft
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "tiny.gguf")
        subprocess.run([a.make_model, model], check=True)
        data = os.path.join(tmp, "train.jsonl")
        with open(data, "w") as f:
            for i in range(24):
                x, y = i % 7, (i * 3) % 5
                if i % 2:
                    f.write(json.dumps({"prompt": f"{x}+{y}=", "completion": str(x + y)}) + "\n")
                else:
                    f.write(json.dumps({"messages": [{"role": "user", "content": f"{x}+{y}?"},
                                                     {"role": "assistant", "content": str(x + y)}]})
                            + "\n")
        base = ["--model", model, "--data", data, "--batch-tokens", "160",
                "--micro-batch-tokens", "64", "--lr", "3e-3", "--warmup-steps", "2", "--seed", "3"]

        # --help
        rc, out = train(weft, ["--help"])
        check(rc == 0 and all(o in out for o in ["--data", "--steps", "--resume", "--save",
                                                 "--checkpoint-dir", "--batch-tokens", "--lr"]),
              "--help lists the options")
        # Missing and bad data.
        rc, out = train(weft, ["--model", model])
        check(rc == 2 and "--data is required" in out, "no --data: exit 2 with a message")
        bad = os.path.join(tmp, "bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"prompt": "a", "completion": "b"}\n{oops\n')
        rc, out = train(weft, ["--model", model, "--data", bad])
        check(rc == 2 and "bad.jsonl:2: not valid JSON" in out, "a bad line is named: " + out[-200:])

        # A straight run of 8 steps with checkpoints, metrics and an f32 export.
        straight = os.path.join(tmp, "straight")
        rc, out = train(weft, base + ["--steps", "8", "--checkpoint-dir", straight,
                                      "--checkpoint-every", "3", "--keep-checkpoints", "2",
                                      "--save", os.path.join(straight, "out.gguf"),
                                      "--save-type", "f32"])
        check(rc == 0, f"straight run exits 0 (rc {rc}): {out[-400:]}")
        check("step 8/8" in out and "loss" in out and "tok/s" in out and "eta" in out,
              "progress line per step")
        m_straight = metrics(os.path.join(straight, "metrics.jsonl"))
        check([r["step"] for r in m_straight] == list(range(1, 9)), "metrics.jsonl has steps 1..8")
        check(m_straight[-1]["loss"] < m_straight[0]["loss"], "the loss goes down")
        ckpts = sorted(f for f in os.listdir(straight) if f.endswith(".ckpt"))
        check(ckpts == ["step-00000006.ckpt", "step-00000008.ckpt"],
              f"checkpoints every 3 steps and at the end, newest 2 kept: {ckpts}")

        # Stopped after 4 steps, resumed to 8: the same losses and the same exported bytes. (The
        # first half runs with --steps 4, so its schedule would differ from the straight run's;
        # both use a constant rate after the warmup, and the resume says that the schedule changed.)
        straight = os.path.join(tmp, "straight-constant")
        const = base + ["--lr-schedule", "constant", "--save-type", "f32"]
        rc, _ = train(weft, const + ["--steps", "8", "--checkpoint-dir", straight,
                                     "--save", os.path.join(straight, "out.gguf")])
        m_straight = metrics(os.path.join(straight, "metrics.jsonl"))
        split = os.path.join(tmp, "split")
        rc, _ = train(weft, const + ["--steps", "4", "--checkpoint-dir", split])
        check(rc == 0, "first half exits 0")
        rc, out = train(weft, const + ["--steps", "8", "--checkpoint-dir", split, "--resume",
                                       "--save", os.path.join(split, "out.gguf")])
        check(rc == 0 and "resumed from" in out and "step 5/8" in out and "step 4/8" not in out,
              "the resumed run starts at step 5")
        check("another learning-rate schedule" in out, "a changed schedule is said on resume")
        m_split = metrics(os.path.join(split, "metrics.jsonl"))
        check([r["loss"] for r in m_split] == [r["loss"] for r in m_straight],
              "resumed loss curve equals the straight run's, bit for bit")
        same = open(os.path.join(split, "out.gguf"), "rb").read() == \
            open(os.path.join(straight, "out.gguf"), "rb").read()
        check(same, "resumed weights equal the straight run's (identical f32 export)")

        # A checkpoint already at --steps: said so, nothing trained, export still written.
        rc, out = train(weft, base + ["--steps", "8", "--checkpoint-dir", straight, "--resume",
                                      "--save", os.path.join(tmp, "again.gguf")])
        check(rc == 0 and "no step left to train" in out and "step 9/" not in out and
              os.path.exists(os.path.join(tmp, "again.gguf")), "resume at --steps says so")

        # A corrupt newest checkpoint: named, and the older one is used.
        newest = os.path.join(straight, "step-00000008.ckpt")
        with open(newest, "r+b") as f:
            f.seek(100)
            f.write(b"\x00\x01\x02")
        rc, out = train(weft, base + ["--steps", "8", "--checkpoint-dir", straight, "--resume"])
        check(rc == 0 and "step-00000008.ckpt is unusable" in out and "step 7/8" in out,
              "a corrupt checkpoint is named and the previous one used")

        # SIGTERM: a checkpoint at the step reached, exit 143, and --resume continues from it.
        sig = os.path.join(tmp, "sig")
        p = subprocess.Popen([weft, "train"] + base + ["--steps", "100000", "--checkpoint-dir", sig,
                                                       "--checkpoint-every", "100000"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen = ""
        deadline = time.time() + 120
        while time.time() < deadline and "step 3/" not in seen:
            line = p.stdout.readline()
            if not line:
                break
            seen += line
        p.send_signal(signal.SIGTERM)
        rest, _ = p.communicate(timeout=60)
        check(p.returncode == 143 and "SIGTERM" in rest, f"SIGTERM: exit 143 (rc {p.returncode})")
        files = [f for f in os.listdir(sig) if f.endswith(".ckpt")]
        check(len(files) == 1, f"SIGTERM wrote one checkpoint: {files}")
        if files:
            at = int(files[0][5:13])
            rc, out = train(weft, base + ["--steps", str(at + 1), "--checkpoint-dir", sig,
                                          "--resume"])
            check(rc == 0 and f"step {at + 1}/{at + 1}" in out, "resume after SIGTERM continues")

        # --eval-data: the held-out loss at step 0, every --eval-every steps and at the end, as
        # "kind": "eval" lines beside the steps; a bad eval line is named; misuse is refused.
        ev = os.path.join(tmp, "eval.jsonl")
        with open(ev, "w") as f:
            for x, y in [(7, 8), (9, 4), (6, 6)]:
                f.write(json.dumps({"prompt": f"{x}+{y}=", "completion": str(x + y)}) + "\n")
        em = os.path.join(tmp, "eval-metrics.jsonl")
        rc, out = train(weft, base + ["--steps", "4", "--eval-data", ev, "--eval-every", "2",
                                      "--metrics", em])
        rows = [json.loads(line) for line in open(em)] if rc == 0 else []
        evals = [r for r in rows if r.get("kind") == "eval"]
        steps = [r for r in rows if "kind" not in r]
        check(rc == 0 and [e["step"] for e in evals] == [0, 2, 4] and
              [r["step"] for r in steps] == [1, 2, 3, 4] and "eval at step 4: loss" in out,
              f"--eval-data --eval-every 2: evaluations at steps 0, 2, 4 ({[e['step'] for e in evals]})")
        check(evals and all(e["eval_examples"] == 3 and e["eval_tokens"] > 0 for e in evals) and
              evals[-1]["eval_loss"] < evals[0]["eval_loss"],
              f"the held-out loss falls ({[round(e['eval_loss'], 3) for e in evals]})")
        check(evals and abs(evals[0]["eval_ppl"] - math.exp(evals[0]["eval_loss"])) < 1e-6 * evals[0]["eval_ppl"],
              "eval_ppl is exp(eval_loss)")
        rc, out = train(weft, ["--model", model, "--data", data, "--eval-data", bad])
        check(rc == 2 and "bad.jsonl:2: not valid JSON" in out, "a bad eval line is named")
        rc, out = train(weft, base + ["--steps", "1", "--eval-every", "2"])
        check(rc == 2 and "--eval-every needs --eval-data" in out, "--eval-every alone is refused")
        # A trainer group evaluates too: each rank its share, the sums over the group; at step 0
        # the weights are the single process's, so is the loss (to f32 rounding: the batches differ).
        gm = os.path.join(tmp, "group-eval.jsonl")
        rc, out = train(weft, base + ["--steps", "4", "--eval-data", ev, "--eval-every", "2",
                                      "--trainers", "2", "--threads", "1", "--metrics", gm])
        gevals = [r for r in (json.loads(line) for line in open(gm)) if r.get("kind") == "eval"] \
            if rc == 0 else []
        check(rc == 0 and [e["step"] for e in gevals] == [0, 2, 4] and
              all(e["eval_examples"] == 3 for e in gevals),
              f"--trainers 2 --eval-data: evaluations at 0, 2, 4 (rc {rc}) {out[-300:]}")
        check(gevals and evals and
              abs(gevals[0]["eval_loss"] - evals[0]["eval_loss"]) <= 1e-6 * evals[0]["eval_loss"] and
              gevals[0]["eval_tokens"] == evals[0]["eval_tokens"],
              "the group's step-0 evaluation equals the single process's "
              f"({gevals[:1]} vs {evals[:1]})")

        # --config: options from a TOML file, flags win.
        cfg = os.path.join(tmp, "train.toml")
        with open(cfg, "w") as f:
            f.write("[train]\nsteps = 2\nbatch_tokens = 100\nlr = 1e-3\n")
        rc, out = train(weft, ["--config", cfg, "--model", model, "--data", data,
                               "--metrics", os.path.join(tmp, "cfg.jsonl")])
        check(rc == 0 and "step 2/2" in out, "--config sets --steps")

        # The export is served: `weft generate` loads it.
        g = subprocess.run([weft, "generate", "--model", os.path.join(straight, "out.gguf"),
                            "-p", "1+2=", "--max-tokens", "4", "--weights-memory", "mmap"],
                           capture_output=True, text=True, timeout=120)
        check(g.returncode == 0, f"weft generate serves the export (rc {g.returncode}) "
                                 f"{g.stderr[-300:]}")

        # A mixture-of-experts model trains (router and experts), exports and is served.
        moe = os.path.join(tmp, "tiny-moe.gguf")
        subprocess.run([a.make_model, moe, "--experts", "4", "--experts-used", "2"], check=True)
        moe_dir = os.path.join(tmp, "moe")
        rc, out = train(weft, ["--model", moe] + base[2:] + [
            "--steps", "6", "--checkpoint-dir", moe_dir, "--router-aux-loss-coef", "0.02",
            "--save", os.path.join(moe_dir, "out.gguf"), "--save-type", "q8_0"])
        check(rc == 0 and "step 6/6" in out, f"an MoE model trains (rc {rc}): {out[-300:]}")
        m_moe = metrics(os.path.join(moe_dir, "metrics.jsonl"))
        check(len(m_moe) == 6 and m_moe[-1]["loss"] < m_moe[0]["loss"], "the MoE loss goes down")
        rc, out = train(weft, base + ["--steps", "1", "--router-aux-loss-coef", "0.02"])
        check(rc != 0 and "mixture-of-experts" in out,
              f"a dense model refuses --router-aux-loss-coef (rc {rc}): {out[-200:]}")
        g = subprocess.run([weft, "generate", "--model", os.path.join(moe_dir, "out.gguf"),
                            "-p", "1+2=", "--max-tokens", "4"],
                           capture_output=True, text=True, timeout=120)
        check(g.returncode == 0, f"weft generate serves the MoE export (rc {g.returncode}) "
                                 f"{g.stderr[-300:]}")

    return finish()


if __name__ == "__main__":
    sys.exit(main())
