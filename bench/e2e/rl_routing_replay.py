#!/usr/bin/env python3
"""Routing replay on a mixture-of-experts model: the train/inference mismatch of `weft rl` with and
without `--routing-replay`, per rollout weight type, same seeds (docs/rl.md, "Mixture-of-experts
models").

    bench/e2e/rl_routing_replay.py --weft build/release/apps/weft \
        --make-model build/release/tests/weft_make_tiny_model [--types f32,bf16,f16,q8_0] \
        [--out bench/results/rl-routing-replay.json] [--png ...png] [--instruction-words N]

Each run is one `weft rl` step (16 prompts x 4 samples, 32 new tokens) on a generated 4-layer,
8-expert top-2 model; a tiny KL coefficient makes every sample train, so the first step's policy
ratio — the trainer's probability of each sampled token over the rollout engine's, on the same
weights, before any update — measures the mismatch alone. Reported per run: mean |ratio - 1|, the
share of tokens outside PPO's clip range, and (with replay) the share of replayed (token, layer)
routes the trainer's own router would have chosen otherwise, and the share of prompt tokens the
rollout engine took from its prefix cache. `--instruction-words N` puts the same N-word instruction
before every prompt, so prompts share cached blocks (routing replay keeps the prefix cache: the
routes of cached blocks live beside their K/V).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def run(weft, model, data, rollout_type, replay, metrics):
    cmd = [weft, "rl", "--model", model, "--data", data, "--match", "contains",
           "--prompt-format", "raw", "--prompts-per-step", "16", "--group-size", "4",
           "--max-new-tokens", "32", "--eval-prompts", "0", "--eval-every", "0", "--lr", "1e-6",
           "--kl-coef", "1e-9", "--seed", "7", "--threads", "2", "--steps", "1",
           "--temperature", "1.0", "--rollout-type", rollout_type, "--metrics", metrics]
    if replay:
        cmd.append("--routing-replay")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"weft rl failed ({p.returncode}): {p.stdout[-800:]}{p.stderr[-800:]}")
    step = [json.loads(line) for line in open(metrics) if '"kind":"step"' in line][0]
    return {"rollout_type": rollout_type, "routing_replay": replay,
            "ratio_deviation": step["ratio_deviation"], "clip_fraction": step["clip_fraction"],
            "routes_replayed": step.get("routes_replayed", 0),
            "route_mismatch": step.get("route_mismatch", 0.0),
            "prompt_cache_hit": step.get("prompt_cache_hit", 0.0),
            "rollout_s": step["rollout_s"], "wall_s": time.perf_counter() - t0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weft", required=True)
    ap.add_argument("--make-model", required=True)
    ap.add_argument("--types", default="f32,bf16,f16,q8_0")
    ap.add_argument("--out", default="bench/results/rl-routing-replay.json")
    ap.add_argument("--png", default="")
    ap.add_argument("--instruction-words", type=int, default=0,
                    help="an instruction of this many words shared by every prompt (0: none)")
    a = ap.parse_args()
    words = ["read", "the", "request", "below", "carefully", "and", "answer", "with", "one",
             "letter", "only"]
    instruction = " ".join(words[i % len(words)] for i in range(a.instruction_words))
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "moe.gguf")
        subprocess.run([a.make_model, model, "--layers", "4", "--embd", "256", "--heads", "8",
                        "--kv-heads", "4", "--ff", "512", "--experts", "8", "--experts-used", "2",
                        "--vocab", "2048", "--context", "1024"], check=True)
        data = os.path.join(tmp, "prompts.jsonl")
        with open(data, "w") as f:
            for i in range(64):
                prompt = f"Write the letter e ({i})."
                if instruction:
                    prompt = instruction + ". " + prompt
                f.write(json.dumps({"prompt": prompt, "answer": "e"}) + "\n")
        rows = []
        for t in a.types.split(","):
            for replay in (False, True):
                r = run(a.weft, model, data, t, replay, os.path.join(tmp, f"m-{t}-{replay}.jsonl"))
                rows.append(r)
                print(f"{t:5s} replay={'on ' if replay else 'off'}  mean |ratio-1| "
                      f"{r['ratio_deviation']:.2e}  clipped {100 * r['clip_fraction']:.2f}%  "
                      f"routes differing {100 * r['route_mismatch']:.2f}% of "
                      f"{r['routes_replayed']}  prompt cache hit "
                      f"{100 * r['prompt_cache_hit']:.0f}%  rollout {r['rollout_s']:.2f}s",
                      flush=True)
    out = {"date": time.strftime("%Y-%m-%d"), "model": "generated: 4 layers, embd 256, 8 experts "
           "top-2, ff 512, vocab 2048", "step": "16 prompts x 4 samples, 32 new tokens, T=1",
           "instruction_words": a.instruction_words,
           "runs": rows}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    json.dump(out, open(a.out, "w"), indent=1)
    print(f"-> {a.out}")
    if a.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        types = a.types.split(",")
        fig, ax = plt.subplots(figsize=(7, 4))
        w = 0.38
        for k, replay in enumerate((False, True)):
            vals = [next(r["ratio_deviation"] for r in rows
                         if r["rollout_type"] == t and r["routing_replay"] == replay) for t in types]
            ax.bar([i + (k - 0.5) * w for i in range(len(types))], vals, w,
                   label="routing replay" if replay else "trainer re-routes")
        ax.set_xticks(range(len(types)))
        ax.set_xticklabels([f"{t} rollouts" for t in types])
        ax.set_yscale("log")
        ax.set_ylabel("mean |pi_train / pi_rollout - 1| (step 1)")
        ax.set_title("train/inference mismatch, MoE 8 experts top-2")
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.png, dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
