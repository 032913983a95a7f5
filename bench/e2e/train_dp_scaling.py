#!/usr/bin/env python3
"""Data-parallel scaling of `weft train`: the same run (model, data, seed, tokens per update) with
one trainer (in one process) and with K trainer processes (`--trainers K`, gradients all-reduced over
UCX), every trainer on one BLAS thread, in the same invocation.

    bench/e2e/train_dp_scaling.py --weft build/release/apps/weft [--model M.gguf] [--trainers 2] \
        [--batch-tokens 2048] [--micro-batch-tokens 512] [--steps 4] [--repeat 2] \
        [--bucket-mb 0,25] [--lo-rate 2gbit] \
        [--out docs/train-dp-scaling.json] [--png docs/train-dp-scaling.png]

Throughput is tokens per second of optimizer updates (the median over the steps after the first,
which warms up), read from the runs' metrics files; the ratio K-process / 1-process is the scaling
(target >= 1.8x for K = 2, docs/training.md). Also reported: each update's wall time and, for the
group, the time from a SIGKILL of one trainer node to the group training again (recovery).

`--bucket-mb 0,25` runs the group once per value in each repeat (`weft train --bucket-mb`: 0 sums
the gradients after the backward, N > 0 in buckets of N MiB while the backward runs); the JSON has
each value's rate and the all-reduce time the step waited for after its backward. `--lo-rate R`
(root; e.g. 2gbit) caps the loopback device with a tc token-bucket filter for the group runs and
sends the all-reduce over UCX's tcp transport, as between hosts on a link of that rate; the filter
is removed afterwards, whatever happens.
"""
import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def make_data(path, n=600):
    """Chat examples of ~100-200 tokens: questions and worked answers about small sums."""
    with open(path, "w") as f:
        for i in range(n):
            x, y, z = i % 97, (i * 31) % 89, (i * 7) % 13
            q = f"A store sells {x} apples in the morning, {y} in the afternoon and {z} at night. " \
                f"How many apples does it sell in the whole day? Explain the steps."
            a = f"In the morning it sells {x} apples. In the afternoon it sells {y} more, which " \
                f"makes {x + y}. At night it sells {z} more, so the total for the day is " \
                f"{x + y} + {z} = {x + y + z} apples."
            f.write(json.dumps({"messages": [{"role": "user", "content": q},
                                             {"role": "assistant", "content": a}]}) + "\n")


def run_train(weft, args, workdir, kill_after_step=None):
    """Runs `weft train`; returns (metrics records, wall seconds, recovery seconds or None)."""
    metrics = os.path.join(workdir, "metrics.jsonl")
    cmd = [weft, "train"] + args + ["--checkpoint-dir", workdir, "--metrics", metrics]
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    killed_at = [None]
    recovered_at = [None]

    def read():
        for line in p.stdout:
            lines.append(line)
            if kill_after_step and killed_at[0] is None and \
                    line.startswith(f"step {kill_after_step}/"):
                pid = subprocess.run(["pgrep", "-P", str(p.pid), "-f", "--",
                                      "--node-id trainer-node-1"],
                                     capture_output=True, text=True).stdout.split()
                if pid:
                    killed_at[0] = time.time()
                    os.kill(int(pid[0]), signal.SIGKILL)
            elif killed_at[0] and recovered_at[0] is None and line.startswith("step ") and \
                    "group 2" not in line and any("trainer group 2 formed" in l for l in lines):
                recovered_at[0] = time.time()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    rc = p.wait()
    t.join(timeout=5)
    wall = time.time() - t0
    if rc != 0:
        sys.stderr.write("".join(lines[-40:]))
        raise SystemExit(f"weft train {' '.join(args)} failed with {rc}")
    recs = [json.loads(l) for l in open(metrics) if l.strip()]
    recovery = recovered_at[0] - killed_at[0] if killed_at[0] and recovered_at[0] else None
    return recs, wall, recovery


@contextlib.contextmanager
def lo_rate(rate_spec):
    """A tc token-bucket filter on the loopback device while the block runs (no-op without one)."""
    if not rate_spec:
        yield
        return
    subprocess.run(["tc", "qdisc", "replace", "dev", "lo", "root", "tbf", "rate", rate_spec,
                    "burst", "512kb", "latency", "100ms"], check=True)
    try:
        yield
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], check=False)


def rate(recs):
    """Median tokens/s over the steps after the first."""
    tps = [r["tokens_per_s"] for r in recs[1:] if r["tokens_per_s"] > 0]
    return statistics.median(tps) if tps else 0.0


def plot(res, png):
    """The bars of every repeat: one process and the group at each --bucket-mb."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    buckets = res.get("bucket_mb", [])
    fig, ax = plt.subplots(figsize=(6, 4.5))
    xs = range(len(res["repeats"]))
    w = 0.8 / (1 + len(buckets))
    ax.bar([x - 0.4 + w / 2 for x in xs], [r["one_process_tok_s"] for r in res["repeats"]], w,
           label="1 trainer (1 process)")
    for j, mb in enumerate(buckets):
        key = f"{mb:g}"
        off = -0.4 + w / 2 + (j + 1) * w
        label = f"{res['trainers']} trainer processes, " + \
            ("all-reduce after the backward" if mb == 0 else f"buckets of {key} MiB")
        ax.bar([x + off for x in xs], [r["groups"][key]["group_tok_s"] for r in res["repeats"]],
               w, label=label)
        for x, r in zip(xs, res["repeats"]):
            g = r["groups"][key]
            ax.text(x + off, g["group_tok_s"], f"{g['scaling']:.2f}x", ha="center",
                    va="bottom", fontsize=8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"repeat {x + 1}" for x in xs])
    ax.set_ylabel("training tokens/s (1 BLAS thread each)")
    ax.set_title(f"weft train data-parallel scaling, {res['model']}" +
                 (f", loopback at {res['lo_rate']}" if res.get("lo_rate") else ""), fontsize=9)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weft", required=True)
    ap.add_argument("--model", default=os.path.expanduser(
        "~/.cache/weft/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--trainers", type=int, default=2)
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--micro-batch-tokens", type=int, default=512)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--recovery", action="store_true",
                    help="also SIGKILL trainer-node-1 after step 2 of one group run and time the "
                         "recovery")
    ap.add_argument("--bucket-mb", default="25",
                    help="comma-separated --bucket-mb values for the group runs (0: no overlap)")
    ap.add_argument("--lo-rate", default="",
                    help="tc rate for the loopback device during the group runs (e.g. 2gbit); "
                         "forces --ucx-tls tcp")
    ap.add_argument("--replot", default="",
                    help="only draw --png from this JSON of an earlier run")
    ap.add_argument("--out", default="")
    ap.add_argument("--png", default="")
    a = ap.parse_args()
    if a.replot:
        with open(a.replot) as f:
            plot(json.load(f), a.png)
        return 0
    res = {"model": os.path.basename(a.model), "trainers": a.trainers,
           "batch_tokens": a.batch_tokens, "micro_batch_tokens": a.micro_batch_tokens,
           "steps": a.steps, "threads_per_trainer": 1, "host_cpus": os.cpu_count(),
           "lo_rate": a.lo_rate or None,
           "date": time.strftime("%Y-%m-%d"), "repeats": []}
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "train.jsonl")
        make_data(data)
        base = ["--model", a.model, "--data", data, "--batch-tokens", str(a.batch_tokens),
                "--micro-batch-tokens", str(a.micro_batch_tokens), "--steps", str(a.steps),
                "--threads", "1", "--lr", "1e-5", "--seed", "1", "--checkpoint-every", "1000"]
        buckets = [float(x) for x in a.bucket_mb.split(",") if x.strip()]
        res["bucket_mb"] = buckets
        for i in range(a.repeat):
            one, one_wall, _ = run_train(a.weft, base + ["--trainers", "1"],
                                         os.path.join(tmp, f"one{i}"))
            r1 = rate(one)
            rep = {"one_process_tok_s": r1, "one_process_wall_s": one_wall,
                   "one_process_losses": [r["loss"] for r in one], "groups": {}}
            # Alternate the order of the bucket sizes between repeats.
            for mb in (buckets if i % 2 == 0 else list(reversed(buckets))):
                extra = ["--bucket-mb", f"{mb:g}"]
                with lo_rate(a.lo_rate):
                    if a.lo_rate:
                        extra += ["--ucx-tls", "tcp"]
                    grp, grp_wall, _ = run_train(
                        a.weft, base + ["--trainers", str(a.trainers)] + extra,
                        os.path.join(tmp, f"grp{i}-{mb:g}"))
                rk = rate(grp)
                red = [r.get("allreduce_s", 0.0) for r in grp[1:]]
                step_s = [r["tokens"] / r["tokens_per_s"] for r in grp[1:] if r["tokens_per_s"] > 0]
                g = {"group_tok_s": rk, "scaling": rk / r1 if r1 else 0.0,
                     "group_step_s_median": statistics.median(step_s) if step_s else 0.0,
                     "group_allreduce_s_median": statistics.median(red) if red else 0.0,
                     "group_wall_s": grp_wall, "group_losses": [r["loss"] for r in grp]}
                rep["groups"][f"{mb:g}"] = g
                print(f"repeat {i + 1}: 1 process {r1:.1f} tok/s, {a.trainers} processes "
                      f"(--bucket-mb {mb:g}) {rk:.1f} tok/s -> {g['scaling']:.2f}x (all-reduce "
                      f"waited for {g['group_allreduce_s_median']:.2f} s of "
                      f"{g['group_step_s_median']:.2f} s per step)", flush=True)
            # The first --bucket-mb value under the old keys.
            rep.update({k: v for k, v in rep["groups"][f"{buckets[0]:g}"].items()})
            res["repeats"].append(rep)
        if a.recovery:
            steps = max(a.steps, 6)
            args = [str(steps) if prev == "--steps" else "1" if prev == "--checkpoint-every" else x
                    for prev, x in zip([""] + base, base)]
            _, _, rec = run_train(a.weft, args + ["--trainers", str(a.trainers)],
                                  os.path.join(tmp, "recovery"), kill_after_step=2)
            res["recovery_s"] = rec
            print(f"SIGKILL of a trainer node -> training again after {rec:.1f} s", flush=True)
    res["scaling_median"] = statistics.median(r["scaling"] for r in res["repeats"])
    res["scaling_median_by_bucket_mb"] = {
        f"{mb:g}": statistics.median(r["groups"][f"{mb:g}"]["scaling"] for r in res["repeats"])
        for mb in buckets}
    for mb, sc in res["scaling_median_by_bucket_mb"].items():
        print(f"median scaling 1 -> {a.trainers} trainer processes, --bucket-mb {mb}: {sc:.2f}x")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    if a.png:
        plot(res, a.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
