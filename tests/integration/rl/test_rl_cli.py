#!/usr/bin/env python3
"""`weft rl` as a new user runs it, on a tiny generated model: --help, bad options and data refused
with a message, a run with checkpoints / metrics / export, a stopped-and-resumed run bit-identical
to a straight one, SIGTERM writing a checkpoint that --resume continues from, SIGKILL then
--resume ending with the weights of an unkilled run, --reward-cmd (a Python reward process; garbage
ends the run), --write-sft-data, --config.

The random tiny model answers anything with two to four dots and then noise; the reward is
whether the reply contains "..." (--match contains), which it gets about half the time, so the
groups have a reward spread and the weights really change step to step (a resume check on
weights that never move would prove nothing).

Usage: test_rl_cli.py --weft PATH/TO/weft --make-model PATH/TO/weft_make_tiny_model
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "support"))
from cli_checks import check, finish, read_jsonl as metrics, run_weft  # noqa: E402


def rl(weft, args, timeout=300):
    return run_weft(weft, "rl", args, timeout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    ap.add_argument("--make-model", required=True)
    ap.add_argument("--weft-test", required=True, help="weft with the test hooks (weft_test)")
    a = ap.parse_args()
    weft = a.weft
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "tiny.gguf")
        subprocess.run([a.make_model, model], check=True)
        data = os.path.join(tmp, "prompts.jsonl")
        with open(data, "w") as f:
            for i in range(40):
                f.write(json.dumps({"prompt": f"Say three dots ({i}).", "answer": "..."}) + "\n")
        base = ["--model", model, "--data", data, "--match", "contains", "--prompt-format", "raw",
                "--prompts-per-step", "4", "--group-size", "4", "--max-new-tokens", "8",
                "--eval-prompts", "8", "--lr", "1e-3", "--seed", "5", "--threads", "2"]

        rc, out = rl(weft, ["--help"])
        check(rc == 0 and all(o in out for o in ["--task", "--data", "--group-size", "--steps",
                                                 "--resume", "--clip-high", "--loss-agg",
                                                 "--checkpoint-dir", "--save", "--mode"]),
              "--help lists the options")
        rc, out = rl(weft, base + ["--mode", "stream"])
        check(rc == 2 and "needs --agents" in out, "--mode stream without --agents: exit 2, says why")
        rc, out = rl(weft, base + ["--max-staleness", "2"])
        check(rc == 2 and "--max-staleness needs --mode async" in out,
              "--max-staleness without --mode async is refused, not ignored")
        rc, out = rl(weft, base + ["--bucket-mb", "2"])
        check(rc == 2 and "give --trainers K > 1" in out,
              "--bucket-mb without a trainer group is refused, not ignored")
        rc, out = rl(weft, base + ["--lr", "-1"])
        check(rc != 0 and "--lr: must be > 0, not -1" in out, "a negative --lr says what is wanted")
        rc, out = rl(weft, base + ["--is-cap", "3"])
        check(rc == 2 and "--is-cap needs --off-policy decoupled" in out,
              "--is-cap without --off-policy decoupled is refused")
        rc, out = rl(weft, base + ["--off-policy", "decoupled", "--clip-high", "0.28"])
        check(rc == 2 and "--is-cap instead" in out, "--clip-high with decoupled is refused")
        rc, out = rl(weft, base + ["--ops", "+/"])
        check(rc == 2 and "--ops" in out, "a bad --ops is refused")
        bad = os.path.join(tmp, "bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"prompt": "a", "answer": "1"}\n{oops\n{"prompt": "b"}\n')
        rc, out = rl(weft, ["--model", model, "--data", bad])
        check(rc == 2 and "bad.jsonl:2" in out and "bad.jsonl:3" in out,
              "bad dataset lines are named: " + out[-300:])
        rc, out = rl(weft, base + ["--resume"])
        check(rc == 2 and "--resume needs --checkpoint-dir" in out, "--resume without a directory")

        # Rollout sampling options: the behaviour log-probs the engine records are of
        # softmax(logits / T), as the trainer's are, so the first update's PPO ratio is 1 (up to
        # rounding) whatever T, top-p and top-k — in this process and on a rollout agent.
        graded = os.path.join(tmp, "graded.py")  # a reward that differs within every group
        with open(graded, "w") as f:
            f.write("import json, sys\n"
                    "for line in sys.stdin:\n"
                    "    r = json.loads(line)\n"
                    "    c = r['completion']\n"
                    "    print(json.dumps({'id': r['id'], 'reward': (sum(map(ord, c)) % 97) / 97}),"
                    " flush=True)\n")
        for extra in ([], ["--agents", "1"]):
            rc, out = rl(weft, base + ["--steps", "2", "--temperature", "0.6", "--top-p", "0.9",
                                       "--top-k", "40", "--reward-cmd",
                                       f"python3 {graded}", "--eval-every", "0",
                                       "--metrics", os.path.join(tmp, "temp.jsonl")] + extra,
                         timeout=200)
            check(rc == 0, f"--temperature 0.6 --top-p 0.9 --top-k 40 {extra}: runs "
                           f"(rc {rc}) {out[-300:]}")
            if rc == 0:
                steps = [r for r in metrics(os.path.join(tmp, "temp.jsonl")) if r["kind"] == "step"]
                check(len(steps) == 2 and steps[0]["grad_norm"] > 0 and
                      steps[0]["ratio_deviation"] < 2e-3 and steps[0]["clip_fraction"] == 0.0,
                      f"--temperature 0.6 {extra}: on-policy ratio 1 at the first update "
                      f"(mean |ratio - 1| {steps[0]['ratio_deviation'] if steps else None})")
        rc, out = rl(weft, base + ["--temperature", "0"])
        check(rc != 0 and "--temperature" in out, "--temperature 0 is refused (greedy rollouts "
                                                  "have no group variance): " + out[-200:])
        rc, out = rl(weft, base + ["--top-p", "1.5"])
        check(rc != 0 and "--top-p" in out, "--top-p above 1 is refused")

        # A straight run: progress lines, evaluations, checkpoints, metrics, plot and export.
        straight = os.path.join(tmp, "straight")
        rc, out = rl(weft, base + ["--steps", "6", "--eval-every", "3", "--checkpoint-dir",
                                   straight, "--checkpoint-every", "2", "--keep-checkpoints", "2",
                                   "--save", os.path.join(straight, "out.gguf"),
                                   "--save-type", "f32", "--plot",
                                   os.path.join(straight, "rl.png")])
        check(rc == 0, f"straight run exits 0 (rc {rc}): {out[-500:]}")
        check("step 6/6" in out and "reward" in out and "samples/s" in out and "eta" in out,
              "a progress line per step")
        m = metrics(os.path.join(straight, "metrics.jsonl"))
        steps = [r for r in m if r["kind"] == "step"]
        evals = [r for r in m if r["kind"] == "eval"]
        check([r["step"] for r in steps] == list(range(1, 7)), "metrics.jsonl has steps 1..6")
        check([e["step"] for e in evals] == [0, 3, 6], "evaluations before, every 3 and at the end")
        check(all(r["samples"] == 16 for r in steps), "16 samples per step")
        check(any(r["reward_std"] > 0 for r in steps) and any(r["grad_norm"] > 0 for r in steps),
              "rewards vary and gradients flow")
        ckpts = sorted(f for f in os.listdir(straight) if f.endswith(".ckpt"))
        check(ckpts == ["step-00000004.ckpt", "step-00000006.ckpt"],
              f"checkpoints every 2 steps, newest 2 kept: {ckpts}")
        check(os.path.getsize(os.path.join(straight, "rl.png")) > 10000, "the plot is drawn")

        # Stopped after 3 steps, resumed to 6: the same rewards and losses, the same weights.
        split = os.path.join(tmp, "split")
        rc, _ = rl(weft, base + ["--steps", "3", "--eval-every", "0", "--checkpoint-dir", split])
        check(rc == 0, "first half exits 0")
        rc, out = rl(weft, base + ["--steps", "6", "--eval-every", "3", "--checkpoint-dir", split,
                                   "--resume", "--save", os.path.join(split, "out.gguf"),
                                   "--save-type", "f32"])
        check(rc == 0 and "resumed from" in out and "step 4/6" in out and "step 3/6" not in out,
              "the resumed run starts at step 4")
        ms = [r for r in metrics(os.path.join(split, "metrics.jsonl")) if r["kind"] == "step"]
        check([(r["reward"], r["loss"]) for r in ms] == [(r["reward"], r["loss"]) for r in steps],
              "resumed rewards and losses equal the straight run's, bit for bit")
        same = open(os.path.join(split, "out.gguf"), "rb").read() == \
            open(os.path.join(straight, "out.gguf"), "rb").read()
        check(same, "resumed weights equal the straight run's (identical f32 export)")
        changed = open(os.path.join(straight, "out.gguf"), "rb").read() != open(model, "rb").read()
        check(changed, "training changed the weights")

        # SIGTERM: a checkpoint at the step reached, exit 143; --resume continues from it.
        sig = os.path.join(tmp, "sig")
        p = subprocess.Popen([weft, "rl"] + base + ["--steps", "100000", "--eval-every", "0",
                                                    "--checkpoint-dir", sig,
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
            rc, out = rl(weft, base + ["--steps", str(at + 1), "--eval-every", "0",
                                       "--checkpoint-dir", sig, "--resume"])
            check(rc == 0 and f"step {at + 1}/{at + 1}" in out, "resume after SIGTERM continues")
        # Another seed's checkpoint is refused.
        rc, out = rl(weft, [x if x != "5" else "6" for x in base] +
                     ["--steps", "9", "--checkpoint-dir", straight, "--resume"])
        check(rc == 2 and "seed" in out, "a checkpoint of another seed is refused")

        # SIGKILL (no chance to checkpoint): --resume continues from the newest complete
        # checkpoint and ends with the weights of a run that was never killed.
        kill = os.path.join(tmp, "kill")
        p = subprocess.Popen([weft, "rl"] + base + ["--steps", "100000", "--eval-every", "0",
                                                    "--checkpoint-dir", kill,
                                                    "--checkpoint-every", "2"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen = ""
        while "step 7/" not in seen:
            line = p.stdout.readline()
            if not line:
                break
            seen += line
        p.kill()
        p.communicate(timeout=60)
        done = sorted(int(f[5:13]) for f in os.listdir(kill) if f.endswith(".ckpt"))
        check(len(done) > 0, f"checkpoints before the SIGKILL: {done}")
        if done:
            end = done[-1] + 3
            rc, out = rl(weft, base + ["--steps", str(end), "--eval-every", "0",
                                       "--checkpoint-dir", kill, "--resume", "--save",
                                       os.path.join(kill, "out.gguf"), "--save-type", "f32"])
            check(rc == 0 and f"step {done[-1] + 1}/{end}" in out, "resume after SIGKILL continues")
            ref = os.path.join(tmp, "ref")
            rc, _ = rl(weft, base + ["--steps", str(end), "--eval-every", "0", "--save",
                                     os.path.join(tmp, "ref.gguf"), "--save-type", "f32",
                                     "--metrics", os.path.join(tmp, "ref.jsonl")])
            same = rc == 0 and open(os.path.join(kill, "out.gguf"), "rb").read() == \
                open(os.path.join(tmp, "ref.gguf"), "rb").read()
            check(same, "killed + resumed weights equal an unkilled run's")

        # --reward-cmd: a Python reward process scores the samples; garbage ends the run by name.
        script = os.path.join(tmp, "reward.py")
        with open(script, "w") as f:
            f.write("import json, sys\n"
                    "for line in sys.stdin:\n"
                    "    r = json.loads(line)\n"
                    "    print(json.dumps({'id': r['id'], "
                    "'reward': float('...' in r['completion'])}), flush=True)\n")
        rc, out = rl(weft, base + ["--steps", "3", "--eval-every", "3", "--reward-cmd",
                                   f"python3 {script}", "--metrics",
                                   os.path.join(tmp, "rc.jsonl")])
        rows = metrics(os.path.join(tmp, "rc.jsonl")) if rc == 0 else []
        check(rc == 0 and "rewards from" in out and
              any(r.get("reward_std", 0) > 0 for r in rows if r["kind"] == "step"),
              f"--reward-cmd scores the samples (rc {rc}) {out[-300:]}")
        # The groups are scored on the loop's reward thread; --blocking-rewards waits for each
        # instead: the same run, step for step.
        rc, out = rl(weft, base + ["--steps", "3", "--eval-every", "3", "--reward-cmd",
                                   f"python3 {script}", "--blocking-rewards", "--metrics",
                                   os.path.join(tmp, "rcb.jsonl")])
        blocking = metrics(os.path.join(tmp, "rcb.jsonl")) if rc == 0 else []
        keys = ["reward", "loss", "grad_norm", "completion_tokens", "pass_at_1"]
        check(rc == 0 and len(blocking) == len(rows) and
              all([r.get(k) for k in keys] == [b.get(k) for k in keys]
                  for r, b in zip(rows, blocking)) and
              all(r["reward_s"] > 0 for r in rows if r["kind"] == "step"),
              f"--blocking-rewards trains what async rewards do (rc {rc}) {out[-300:]}")
        rc, out = rl(weft, base + ["--steps", "1", "--blocking-rewards"])
        check(rc == 2 and "--blocking-rewards needs --reward-cmd" in out,
              "--blocking-rewards without an external reward is refused")
        # --reward-procs 2: two copies of the program score batches at once; the same run.
        rc, out = rl(weft, base + ["--steps", "3", "--eval-every", "3", "--reward-cmd",
                                   f"python3 {script}", "--reward-procs", "2", "--metrics",
                                   os.path.join(tmp, "rcp.jsonl")])
        procs = metrics(os.path.join(tmp, "rcp.jsonl")) if rc == 0 else []
        check(rc == 0 and "2 copies" in out and len(procs) == len(rows) and
              all([r.get(k) for k in keys] == [b.get(k) for k in keys]
                  for r, b in zip(rows, procs)),
              f"--reward-procs 2 trains what one copy does (rc {rc}) {out[-300:]}")
        for extra, why in ((["--reward-cmd", f"python3 {script}", "--reward-procs", "2",
                             "--blocking-rewards"], "--reward-procs"),
                           (["--reward-procs", "2"], "--reward-procs"),
                           (["--reward-cmd", f"python3 {script}", "--reward-concurrency", "2"],
                            "--reward-concurrency")):
            rc, out = rl(weft, base + ["--steps", "1"] + extra)
            check(rc == 2 and why in out, f"{' '.join(extra[-2:])} is refused where it does nothing")
        garbage = os.path.join(tmp, "garbage.py")
        with open(garbage, "w") as f:
            f.write("import sys\nfor line in sys.stdin:\n    print('so good', flush=True)\n")
        rc, out = rl(weft, base + ["--steps", "3", "--eval-every", "0", "--reward-cmd",
                                   f"python3 {garbage}"])
        check(rc == 1 and "'so good'" in out, "a reward process that answers garbage ends the run")

        # --reward-url: an HTTP endpoint scores the samples (the same rewards as the process);
        # a 503 is retried; a wrong count ends the run by name.
        import http.server
        import threading
        seen = {"posts": 0, "fail_first": True, "mode": "ok", "inflight": 0, "max_inflight": 0,
                "met": False}
        lock = threading.Lock()

        class Reward(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    seen["posts"] += 1
                    seen.setdefault("sizes", []).append(len(body["samples"]))
                    seen["inflight"] += 1
                    seen["max_inflight"] = max(seen["max_inflight"], seen["inflight"])
                try:
                    code, out = self.answer(body)
                finally:
                    # Counted out before the answer leaves: the client's next request cannot
                    # overlap this one when it waits for the answer.
                    with lock:
                        seen["inflight"] -= 1
                self.send_response(code)
                if out is not None:
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                if out is not None:
                    self.wfile.write(out)

            def answer(self, body):
                if seen["mode"] == "meet" and not seen["met"]:
                    # The first request waits (up to 10 s) for a second one to arrive.
                    deadline = time.time() + 10
                    while time.time() < deadline and seen["max_inflight"] < 2:
                        time.sleep(0.01)
                    seen["met"] = seen["max_inflight"] >= 2
                seen["auth"] = self.headers.get("Authorization")
                if seen["fail_first"]:
                    seen["fail_first"] = False
                    return 503, None
                rewards = [float("..." in x["completion"]) for x in body["samples"]]
                if seen["mode"] == "short":
                    rewards = rewards[:-1]
                return 200, json.dumps({"rewards": rewards}).encode()
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Reward)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{httpd.server_address[1]}/score"
        url_metrics = os.path.join(tmp, "url.jsonl")
        reward_metrics = os.path.join(tmp, "rc.jsonl")
        rc, out = rl(weft, base + ["--steps", "3", "--eval-every", "0", "--reward-url", url,
                                   "--reward-key", "s3cret", "--metrics", url_metrics])
        url_rows = [r for r in metrics(url_metrics) if r["kind"] == "step"] if rc == 0 else []
        check(rc == 0 and "sending the" in out and seen["posts"] >= 4 and
              seen.get("auth") == "Bearer s3cret" and set(seen["sizes"]) == {4} and
              url_rows and url_rows[-1]["reward_restarts"] >= 1,
              f"--reward-url scores through HTTP, retries a 503, sends the key (rc {rc}) {out[-300:]}")
        if rc == 0 and os.path.exists(reward_metrics):
            by_url = [(r["reward"], r["loss"]) for r in metrics(url_metrics) if r["kind"] == "step"]
            by_cmd = [(r["reward"], r["loss"]) for r in metrics(reward_metrics)
                      if r["kind"] == "step"]
            check(by_url == by_cmd, "the endpoint's rewards equal the reward process's")
        # Requests in flight: several by default (--reward-concurrency 4), one with 1; the same run.
        seen.update(mode="meet", max_inflight=0)
        rc, out = rl(weft, base + ["--steps", "2", "--eval-every", "0", "--reward-url", url,
                                   "--metrics", os.path.join(tmp, "url4.jsonl")])
        check(rc == 0 and seen["met"] and "4 at once" in out,
              f"--reward-url sends several groups at once (rc {rc}, at most {seen['max_inflight']})")
        deadline = time.time() + 10
        while seen["inflight"] > 0 and time.time() < deadline:
            time.sleep(0.01)  # the handlers count a request out after its answer is sent
        seen.update(mode="ok", max_inflight=0)
        rc, out = rl(weft, base + ["--steps", "2", "--eval-every", "0", "--reward-url", url,
                                   "--reward-concurrency", "1", "--metrics",
                                   os.path.join(tmp, "url1.jsonl")])
        def url_steps(name):
            path = os.path.join(tmp, name)
            return [(r["reward"], r["loss"]) for r in metrics(path) if r["kind"] == "step"] \
                if os.path.exists(path) else None
        one = url_steps("url1.jsonl") if rc == 0 else []
        four = url_steps("url4.jsonl")
        check(rc == 0 and seen["max_inflight"] == 1 and one == four,
              f"--reward-concurrency 1 sends one at a time, the same rewards (rc {rc}, "
              f"at most {seen['max_inflight']})")
        # --reward-batch samples: POSTs of the samples that finished meanwhile, the same rewards.
        seen["sizes"] = []
        rc, out = rl(weft, base + ["--steps", "2", "--eval-every", "0", "--reward-url", url,
                                   "--reward-batch", "samples", "--metrics",
                                   os.path.join(tmp, "urls.jsonl")])
        check(rc == 0 and url_steps("urls.jsonl") == four and seen["sizes"] and
              min(seen["sizes"]) == 1 and "finished samples" in out,
              f"--reward-batch samples POSTs finished samples, the same rewards (rc {rc}, "
              f"sizes {sorted(set(seen['sizes']))})")
        rc, out = rl(weft, base + ["--steps", "1", "--reward-url", url, "--reward-batch",
                                   "samples", "--blocking-rewards"])
        check(rc == 2 and "--reward-batch" in out, "--reward-batch samples with blocking rewards is refused")
        seen["mode"] = "short"
        rc, out = rl(weft, base + ["--steps", "2", "--eval-every", "0", "--reward-url", url])
        check(rc == 1 and "rewards for" in out, f"a wrong reward count ends the run: {out[-200:]}")
        httpd.shutdown()
        rc, out = rl(weft, base + ["--reward-url", "ftp://x", "--steps", "1"])
        check(rc == 2 and "expected http://" in out, "a bad --reward-url is refused")

        # Options of the update, on the same run. The tiny model never stops early, so every
        # completion has --max-new-tokens tokens and the three aggregations coincide (the unit
        # tests check where they differ); scaling the advantages changes the loss.
        def losses(extra):
            path = os.path.join(tmp, "opt.jsonl")
            rc, out = rl(weft, base + ["--steps", "3", "--eval-every", "0", "--metrics", path] +
                         extra)
            rows = metrics(path) if rc == 0 else []
            return rc, [r["loss"] for r in rows if r["kind"] == "step"], rows
        _, plain, _ = losses([])
        for agg in ("sequence", "constant"):
            rc, got, _ = losses(["--loss-agg", agg])
            check(rc == 0 and len(got) == 3 and
                  all(abs(a - b) <= 1e-6 * max(1.0, abs(b)) for a, b in zip(got, plain)),
                  f"--loss-agg {agg} equals token aggregation when all lengths are equal")
        rc, got, _ = losses(["--no-scale-rewards"])
        check(rc == 0 and len(got) == 3 and got != plain, "--no-scale-rewards changes the loss")
        # bf16 rollout weights: the behaviour log-probs differ a little from the trainer's f32 ones;
        # a clip range narrower than that difference clips tokens.
        rc, _, rows = losses(["--rollout-type", "bf16"])
        dev = [r["ratio_deviation"] for r in rows if r["kind"] == "step"]
        check(rc == 0 and len(dev) == 3 and 0 < dev[0] < 0.05,
              f"--rollout-type bf16: trainer/engine ratio deviation small but not 0: {dev}")
        # q8_0 rollout weights (quantized rollouts): further from the trainer than bf16, still
        # far inside the clip range.
        rc, _, rows = losses(["--rollout-type", "q8_0"])
        dev_q8 = [r["ratio_deviation"] for r in rows if r["kind"] == "step"]
        check(rc == 0 and len(dev_q8) == 3 and dev[0] < dev_q8[0] < 0.2,
              f"--rollout-type q8_0: ratio deviation above bf16's ({dev[0]:.4f}), below 0.2: "
              f"{dev_q8}")
        rc, _, rows = losses(["--rollout-type", "bf16", "--clip-low", "0.0001", "--clip-high",
                              "0.0001"])
        clip = [r["clip_fraction"] for r in rows if r["kind"] == "step"]
        check(rc == 0 and len(clip) == 3 and clip[0] > 0, f"a narrow clip range clips: {clip}")

        # --mode async: later steps generate while a step trains; staleness within the bound,
        # recorded per step; two runs with one seed are identical; decoupled correction runs.
        def async_run(extra):
            path = os.path.join(tmp, "async.jsonl")
            rc, out = rl(weft, base + ["--steps", "5", "--eval-every", "0", "--metrics", path,
                                       "--mode", "async", "--max-staleness", "2"] + extra)
            rows = [r for r in metrics(path) if r["kind"] == "step"] if rc == 0 else []
            return rc, out, rows
        rc, out, rows = async_run([])
        check(rc == 0 and [r["step"] for r in rows] == list(range(1, 6)) and
              all(r["samples"] == 16 for r in rows), f"--mode async trains 5 steps: {out[-300:]}")
        check(all(0 <= r["staleness_max"] <= 2 for r in rows) and
              any(r["staleness_max"] > 0 for r in rows),
              f"async staleness recorded and within K=2: {[r['staleness_max'] for r in rows]}")
        check("next 2 step(s) generate while a step trains" in out and "staleness" in out,
              "async says what it does and reports staleness")
        _, _, again = async_run([])
        check([(r["reward"], r["loss"]) for r in rows] == [(r["reward"], r["loss"]) for r in again],
              "two async runs with one seed are identical")
        check([r["loss"] for r in rows[:3]] != plain,
              "async trains on other rollouts than sync (same seed)")
        rc, _, dec = async_run(["--off-policy", "decoupled", "--is-cap", "1.5"])
        check(rc == 0 and len(dec) == 5 and [r["loss"] for r in dec] != [r["loss"] for r in rows],
              "--off-policy decoupled runs and changes the update")

        # --kl-coef: a reference model; KL 0 at step 1 (the policy is the reference), then > 0.
        rc, got, rows = losses(["--kl-coef", "0.5"])
        kl = [r["kl"] for r in rows if r["kind"] == "step"]
        check(rc == 0 and len(kl) == 3 and kl[0] < 1e-6 and any(k > 0 for k in kl[1:]) and
              got != plain, f"--kl-coef: KL 0 at step 1, then > 0, and the loss changes: {kl}")

        # --updates-per-step: later updates see a ratio away from 1.
        rc, got, rows = losses(["--updates-per-step", "3"])
        dev3 = [r["ratio_deviation"] for r in rows if r["kind"] == "step"]
        _, _, rows1 = losses([])
        dev1 = [r["ratio_deviation"] for r in rows1 if r["kind"] == "step"]
        check(rc == 0 and len(dev3) == 3 and dev3[0] > 5 * dev1[0] and got != plain,
              f"--updates-per-step 3: the ratio moves off 1 ({dev1[0]:.2e} -> {dev3[0]:.2e})")
        rc, out = rl(weft, base + ["--updates-per-step", "2", "--off-policy", "decoupled"])
        check(rc == 2 and "one update per batch" in out,
              "--updates-per-step with --off-policy decoupled is refused")

        # --metrics-port: Prometheus text while the run goes on.
        import socket
        import urllib.request
        with socket.socket() as s_:
            s_.bind(("127.0.0.1", 0))
            port = s_.getsockname()[1]
        p = subprocess.Popen([weft, "rl"] + base + ["--steps", "100000", "--eval-every", "0",
                                                    "--metrics-port", str(port), "--metrics",
                                                    os.path.join(tmp, "prom.jsonl")],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen = ""
        while "step 2/" not in seen:
            line = p.stdout.readline()
            if not line:
                break
            seen += line
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
            text = text.decode()
        except OSError as e:
            text = str(e)
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=60)
        check("weft_rl_steps_total" in text and "weft_rl_reward_mean" in text and
              "weft_rl_weight_version" in text, "--metrics-port serves Prometheus metrics")

        # --write-sft-data: solved training problems, never a held-out one.
        sft = os.path.join(tmp, "sft.jsonl")
        rc, out = rl(weft, ["--model", model, "--task", "arithmetic", "--digits", "1",
                            "--eval-prompts", "30", "--write-sft-data", sft, "--sft-examples",
                            "300"])
        lines = [json.loads(x) for x in open(sft)] if rc == 0 else []
        check(len(lines) == 300 and all(len(x["messages"]) == 2 for x in lines),
              "--write-sft-data writes chat examples")
        ok = True
        for x in lines:
            q = x["messages"][0]["content"]
            a_, b_ = q[len("What is "):q.index("?")].split(" + ")
            ok = ok and int(x["messages"][1]["content"]) == int(a_) + int(b_)
        check(ok, "every SFT answer is right")
        rc, out = rl(weft, ["--model", model, "--task", "arithmetic", "--digits", "1",
                            "--answer-format", "tags", "--eval-prompts", "30", "--write-sft-data",
                            sft, "--sft-examples", "20"])
        lines = [json.loads(x) for x in open(sft)] if rc == 0 else []
        check(len(lines) == 20 and all(
            "<answer></answer>" in x["messages"][0]["content"] and
            x["messages"][1]["content"].startswith("<answer>") for x in lines),
            "--answer-format tags: prompts ask for the tags, SFT answers carry them")
        rc, out = rl(weft, base + ["--format-weight", "0.2", "--steps", "1"])
        check(rc == 2 and "--answer-format tags" in out, "--format-weight without the format is refused")
        rc, out = rl(weft, ["--model", model, "--task", "arithmetic", "--answer-format", "tags",
                            "--prompt-format", "raw", "--steps", "2", "--eval-every", "0",
                            "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens",
                            "4", "--eval-prompts", "4", "--threads", "2",
                            "--metrics", os.path.join(tmp, "fmt.jsonl")])
        check(rc == 0 and "<answer> format" in out, f"a run with --answer-format tags: {out[-200:]}")

        # --config: options from a TOML file, flags win.
        cfg = os.path.join(tmp, "rl.toml")
        with open(cfg, "w") as f:
            f.write("[rl]\nsteps = 2\ngroup_size = 3\n")
        i = base.index("--group-size")
        no_group = base[:i] + base[i + 2:]
        rc, out = rl(weft, ["--config", cfg] + no_group + ["--group-size", "2", "--eval-every", "0",
                                                           "--metrics", os.path.join(tmp, "c.jsonl")])
        cm = metrics(os.path.join(tmp, "c.jsonl")) if rc == 0 else [{}]
        check(rc == 0 and "step 2/2" in out and cm[0].get("samples") == 8,
              "--config sets --steps; the command line's --group-size wins")

        # A mixture-of-experts model: rollouts on an agent (the expert tensors synced over UCX),
        # trainer log-probs equal to the agent's (ratio ≈ 1 before the first update: same routing,
        # same weights), and a reward with variance that the policy learns within 3 steps.
        moe = os.path.join(tmp, "tiny-moe.gguf")
        subprocess.run([a.make_model, moe, "--experts", "4", "--experts-used", "2"], check=True)
        moe_data = os.path.join(tmp, "moe.jsonl")
        with open(moe_data, "w") as f:
            for i in range(40):
                f.write(json.dumps({"prompt": f"Say e ({i}).", "answer": "e"}) + "\n")
        mi = base.index("--data")
        moe_base = ["--model", moe] + base[2:mi + 1] + [moe_data] + base[mi + 2:]
        rc, out = rl(weft, moe_base + ["--steps", "3", "--agents", "1", "--eval-every", "0",
                                       "--metrics", os.path.join(tmp, "moe-m.jsonl")])
        mm = [r for r in metrics(os.path.join(tmp, "moe-m.jsonl")) if r.get("kind") == "step"] \
            if rc == 0 else []
        check(rc == 0 and len(mm) == 3, f"weft rl trains an MoE model on an agent (rc {rc})")
        if len(mm) == 3:
            check(mm[0]["ratio_deviation"] < 1e-3,
                  f"trainer and agent agree on the MoE policy: {mm[0]['ratio_deviation']}")
            check(mm[-1]["reward"] > mm[0]["reward"],
                  f"the MoE policy learns: {[r['reward'] for r in mm]}")
        # Routing replay on the agent (f16 rollouts): the routes travel with the rollouts and the
        # trainer routes every replayed token as the agent did.
        rc, out = rl(weft, moe_base + ["--steps", "2", "--agents", "1", "--eval-every", "0",
                                       "--rollout-type", "f16", "--routing-replay", "--kl-coef",
                                       "1e-9", "--metrics", os.path.join(tmp, "moe-rr.jsonl")])
        rr = [r for r in metrics(os.path.join(tmp, "moe-rr.jsonl")) if r.get("kind") == "step"] \
            if rc == 0 else []
        check(rc == 0 and len(rr) == 2 and all(r["routes_replayed"] > 0 for r in rr) and
              "routing replay:" in out, f"--routing-replay on an agent (rc {rc}): {out[-300:]}")
        # Long prompts with a shared instruction: the agent's prefix cache serves most prompt
        # tokens with routing replay on too, and the routes of the cached blocks (kept beside
        # their K/V) are the ones the trainer replays — the policy ratio stays at the f16 level.
        long_data = os.path.join(tmp, "moe-long.jsonl")
        with open(long_data, "w") as f:
            pre = ("You are a careful assistant. Read the request below, think about what it asks "
                   "for, and then answer with exactly the letter it names and nothing else. ")
            for i in range(40):
                f.write(json.dumps({"prompt": pre + f"Say e ({i}).", "answer": "e"}) + "\n")
        long_base = list(moe_base)
        long_base[long_base.index(moe_data)] = long_data
        rc, out = rl(weft, long_base + ["--steps", "1", "--agents", "1", "--eval-every", "0",
                                        "--rollout-type", "f16", "--routing-replay",
                                        "--kl-coef", "1e-9", "--metrics",
                                        os.path.join(tmp, "moe-long.jsonl.m")])
        rl_long = [r for r in metrics(os.path.join(tmp, "moe-long.jsonl.m"))
                   if r.get("kind") == "step"] if rc == 0 else []
        check(rc == 0 and len(rl_long) == 1 and rl_long[0]["prompt_cache_hit"] > 0.5 and
              rl_long[0]["routes_replayed"] > 0 and rl_long[0]["ratio_deviation"] < 1e-4,
              f"--routing-replay keeps the prefix cache, cached routes replay (rc {rc}): "
              f"{rl_long[0] if rl_long else out[-300:]}")
        # A broken agent (weft_test's hook): its first output with routes names an expert that
        # does not exist. The controller refuses the output and restarts the agent, whose
        # rollouts replay; the step completes with the same routes as the undisturbed run.
        os.environ["WEFT_TEST_CORRUPT_ROUTES"] = "1"
        try:
            rc, out = rl(a.weft_test, moe_base + [
                "--steps", "1", "--agents", "1", "--eval-every", "0", "--rollout-type", "f16",
                "--routing-replay", "--kl-coef", "1e-9", "--metrics",
                os.path.join(tmp, "moe-bad.jsonl")])
        finally:
            del os.environ["WEFT_TEST_CORRUPT_ROUTES"]
        rb = [r for r in metrics(os.path.join(tmp, "moe-bad.jsonl")) if r.get("kind") == "step"] \
            if rc == 0 else []
        check(rc == 0 and "sent a malformed output" in out and len(rb) == 1 and rr and
              rb[0]["routes_replayed"] == rr[0]["routes_replayed"],
              f"an agent's invalid routes restart the agent, the step completes (rc {rc}): "
              f"{out[-400:]}")
        # With a trainer group the routes travel to rank 1 and its counts come back: step 1 (the
        # same samples) replays exactly as many routes as one trainer did.
        rc, out = rl(weft, moe_base + ["--steps", "1", "--agents", "1", "--trainers", "2",
                                       "--eval-every", "0", "--rollout-type", "f16",
                                       "--routing-replay", "--kl-coef", "1e-9", "--metrics",
                                       os.path.join(tmp, "moe-rr2.jsonl")])
        rr2 = [r for r in metrics(os.path.join(tmp, "moe-rr2.jsonl")) if r.get("kind") == "step"] \
            if rc == 0 else []
        check(rc == 0 and len(rr2) == 1 and rr and
              rr2[0]["routes_replayed"] == rr[0]["routes_replayed"],
              f"--routing-replay with --trainers 2 (rc {rc}): "
              f"{[r.get('routes_replayed') for r in rr2]} vs {[r.get('routes_replayed') for r in rr]}")
        # The router's load-balancing loss in RL: the step's loss carries coef x aux (aux >= k = 2,
        # its balanced value), on rank 0 and on the trainer group's rank 1 alike (aux is per
        # micro-batch, so two ranks' split of the samples moves it slightly, not by half).
        rc0, _ = rl(weft, moe_base + ["--steps", "1", "--agents", "1", "--eval-every", "0",
                                      "--metrics", os.path.join(tmp, "moe-a0.jsonl")])
        rc1, _ = rl(weft, moe_base + ["--steps", "1", "--agents", "1", "--eval-every", "0",
                                      "--router-aux-loss-coef", "0.1", "--metrics",
                                      os.path.join(tmp, "moe-a1.jsonl")])
        rc2, out = rl(weft, moe_base + ["--steps", "1", "--agents", "1", "--eval-every", "0",
                                        "--router-aux-loss-coef", "0.1", "--trainers", "2",
                                        "--metrics", os.path.join(tmp, "moe-a2.jsonl")])
        la = [[r["loss"] for r in metrics(os.path.join(tmp, f"moe-a{i}.jsonl"))
               if r.get("kind") == "step"] if rc == 0 else [] for i, rc in enumerate((rc0, rc1, rc2))]
        check(all(len(x) == 1 for x in la) and la[1][0] - la[0][0] > 0.1 * 2 * 0.9 and
              abs(la[2][0] - la[1][0]) < 0.01 * la[1][0],
              f"--router-aux-loss-coef adds the balance loss, on every rank (rc {rc0} {rc1} {rc2}): "
              f"{la} {out[-300:] if rc2 else ''}")
        rc, out = rl(weft, base + ["--steps", "1", "--router-aux-loss-coef", "0.1"])
        check(rc == 2 and "needs a mixture-of-experts model" in out,
              f"a dense model refuses --router-aux-loss-coef (rc {rc})")
        rc, out = rl(weft, base + ["--steps", "1", "--routing-replay"])
        check(rc == 2 and "needs a mixture-of-experts model" in out,
              f"a dense model refuses --routing-replay (rc {rc})")

    return finish()


if __name__ == "__main__":
    sys.exit(main())
