#!/usr/bin/env python3
"""Training step throughput: weft's trainer vs PyTorch eager, same run, same model (transformers
loads the same GGUF, f32), same batch, same thread count, same optimizer (AdamW). --device cuda runs
both on the GPU (weft: the whole step in device memory, or with --offload-optimizer AdamW and the
weights on the host; PyTorch: all on the GPU, f32 without TF32).

    bench/e2e/train_vs_pytorch.py --bench build/release/bench/micro/gpu/gpu_train_bench \
        [--model M.gguf] [--threads 2] [--seqs 4] [--seq-tokens 256] [--steps 5] [--repeat 3] \
        [--out bench/results/train-vs-pytorch.json] [--png ...png] [--device cpu|cuda] [--offload-optimizer]

Prints tokens/s of both and their ratio per repeat (median over repeats), weft's share of this host's
SGEMM ceiling, and the checkpoint save time and async stall (docs/training.md).

Each repeat runs both sides in fresh processes (weft's bench binary, and this script again for
PyTorch), in alternating order (weft first in odd repeats, PyTorch first in even ones), so that
neither side keeps warm state from an earlier repeat and a host that speeds up or slows down during
the run does not favour the side that always goes second.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def torch_step_rate(model_path, batch, threads, steps, device="cpu"):
    import torch
    torch.set_num_threads(threads)
    # The oracle's loader: transformers' own GGUF loading, or for a mixture-of-experts GGUF its
    # MixtralForCausalLM with the file's weights (transformers 4.46 loads no llama-layout MoE GGUF).
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "tests", "oracle", "gpu"))
    from train_oracle import load
    model = load(model_path)
    cuda = device.startswith("cuda")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False  # f32 GEMMs, as weft's cuBLAS SGEMMs
        torch.backends.cudnn.allow_tf32 = False
        model = model.to(device)
    model.train()
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    # The strongest eager setup a PyTorch user would pick: the fused AdamW kernel on the GPU, and
    # the sequences as one [S, L] batch when they have one length (no padding then).
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.0},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-5,
                            **({"fused": True} if cuda else {}))
    where = device if cuda else "cpu"
    if len({len(s) for s in batch}) == 1:
        ids = [torch.tensor(batch, device=where)]
    else:
        ids = [torch.tensor([seq], device=where) for seq in batch]
    n_tokens = sum(len(s) for s in batch)
    times = []
    # PyTorch eager on the CPU takes two steps to reach its pace (measured here: 12.0 and 10.7 s,
    # then 5.9-8.6 s a step): both are warm-up and not counted.
    warmup = 2
    for i in range(steps + warmup):
        t0 = time.perf_counter()
        opt.zero_grad()
        total = 0
        for x in ids:  # one batch, or one sequence at a time: never padding, like weft's packing
            logits = model(input_ids=x).logits[:, :-1]
            total = total + torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
        (total / n_tokens).backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    return n_tokens / times[len(times) // 2], times


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", required=True, help="path of gpu_train_bench")
    ap.add_argument("--model", default=os.path.expanduser(
        "~/.cache/weft/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--seq-tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="bench/results/train-vs-pytorch.json")
    ap.add_argument("--png", default="")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda / cuda:N for both trainers")
    ap.add_argument("--offload-optimizer", action="store_true",
                    help="with --device: weft keeps the weights and AdamW on the host (ZeRO-Offload)")
    ap.add_argument("--torch-worker", default="",
                    help=argparse.SUPPRESS)  # internal: run PyTorch on this batch file, print JSON
    a = ap.parse_args()
    if a.torch_worker:
        rate, times = torch_step_rate(a.model, json.load(open(a.torch_worker)), a.threads,
                                      a.steps, a.device)
        print(json.dumps({"rate": rate, "times": times}))
        return 0

    def run_weft(tmp):
        j = os.path.join(tmp, "weft.json")
        subprocess.run([a.bench, "--model", a.model, "--threads", str(a.threads), "--seqs",
                        str(a.seqs), "--seq-tokens", str(a.seq_tokens), "--steps",
                        str(a.steps), "--json", j, "--device", a.device,
                        "--offload-optimizer", "1" if a.offload_optimizer else "0"], check=True)
        return json.load(open(j))

    def run_torch(tmp, batch):
        f = os.path.join(tmp, "batch.json")
        json.dump(batch, open(f, "w"))
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--bench", a.bench,
                              "--model", a.model, "--threads", str(a.threads), "--steps",
                              str(a.steps), "--device", a.device, "--torch-worker", f],
                             check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        return r["rate"], r["times"]

    runs = []
    batch = None
    for r in range(a.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            # The batch is weft's (its data pipeline makes it): the first repeat runs weft first.
            torch_first = r % 2 == 1 and batch is not None
            if torch_first:
                rate, times = run_torch(tmp, batch)
                weft = run_weft(tmp)
                weft.pop("batch")
            else:
                weft = run_weft(tmp)
                batch = weft.pop("batch")
                rate, times = run_torch(tmp, batch)
        runs.append({"weft": weft, "torch_tokens_per_s": rate, "torch_step_s": times,
                     "ratio": weft["tokens_per_s"] / rate,
                     "order": "pytorch, weft" if torch_first else "weft, pytorch"})
        where = (f"weft at {100 * weft['ceiling_share']:.1f}% of the SGEMM peak"
                 if a.device == "cpu" else f"on {weft['device']}")
        print(f"repeat {r + 1}: weft {weft['tokens_per_s']:.0f} tok/s, PyTorch eager {rate:.0f} "
              f"tok/s, ratio {weft['tokens_per_s'] / rate:.2f}x; {where}", flush=True)
    # statistics.median: the mean of the middle two for an even number of repeats (not the upper
    # one, which flattered an even count).
    summary = {
        "model": a.model, "device": a.device, "offload_optimizer": a.offload_optimizer,
        "threads": a.threads, "seqs": a.seqs, "seq_tokens": a.seq_tokens,
        "steps": a.steps, "repeat": a.repeat,
        "ratio_median": statistics.median(x["ratio"] for x in runs),
        "weft_tokens_per_s_median": statistics.median(x["weft"]["tokens_per_s"] for x in runs),
        "torch_tokens_per_s_median": statistics.median(x["torch_tokens_per_s"] for x in runs),
        "ceiling_share_median": statistics.median(x["weft"]["ceiling_share"] for x in runs),
        "checkpoint_sync_s": runs[-1]["weft"]["checkpoint_sync_s"],
        "checkpoint_async_stall_s": runs[-1]["weft"]["checkpoint_async_stall_s"],
        "runs": runs,
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    json.dump(summary, open(a.out, "w"), indent=1)
    where = (f"weft at {100 * summary['ceiling_share_median']:.1f}% of the SGEMM ceiling"
             if a.device == "cpu" else f"both on {a.device}")
    print(f"median ratio weft / PyTorch eager: {summary['ratio_median']:.2f}x; {where}; checkpoint "
          f"{summary['checkpoint_sync_s']:.2f} s sync, async stall "
          f"{summary['checkpoint_async_stall_s']:.3f} s -> {a.out}")
    if a.png:
        plot(summary, a.png)
    return 0


def plot(summary, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = summary["runs"]
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    ax[0].bar(["weft", "PyTorch eager"],
              [summary["weft_tokens_per_s_median"], summary["torch_tokens_per_s_median"]])
    ax[0].set_ylabel("training tokens/s (median)")
    ax[0].set_title(f"one AdamW step, {summary['seqs']}x{summary['seq_tokens']} tokens, "
                    f"{summary['threads']} threads")
    ax[1].bar(["weft step", "checkpoint sync", "async stall"],
              [runs[-1]["weft"]["step_s_median"], summary["checkpoint_sync_s"],
               summary["checkpoint_async_stall_s"]])
    ax[1].set_ylabel("seconds")
    ax[1].set_title("step time vs checkpoint cost")
    fig.tight_layout()
    fig.savefig(png, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
