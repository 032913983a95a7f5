#!/usr/bin/env python3
"""GRPO samples/s: `weft rl --mode sync` against Hugging Face TRL's GRPOTrainer on the same model
(SmolLM2-135M-Instruct: TRL loads the same GGUF through transformers, dequantized to f32; weft
dequantizes it to f32 too), the same task and prompts (1-digit addition in the model's chat
template, the training stream `weft rl --write-sft-data` writes, in order), the same group size,
prompts per step, completion cap, learning rate, loss (token-level PPO-clip, epsilon 0.2, group
std scaling, no KL: TRL's defaults) and threads; one update per step on both. The runs alternate
(TRL, weft, TRL, weft ...) so that the machine's drift hits both alike.

Samples/s counts the training steps only (model loading excluded on both sides). Rewards are each
step's mean reward; with a few steps they show that both learn alike, not which learns faster.

TRL needs torch >= 2.6 and transformers 5: by default they live in a virtual environment
(--venv, created on first use with `pip install torch==2.6.0 trl==1.16.0`), so the system's
PyTorch (used by the oracle tests) is left alone.

--rollout-types f32,q8_0 adds weft runs with other rollout weight types (here: quantized
rollouts), each alternated with TRL's runs too; the f32 run stays the like-for-like figure.

Writes JSON (and a PNG) named rl-vs-trl-<date>.* into --out.
Usage: rl_vs_trl.py --weft build/release/apps/weft [--steps 8] [--repeat 2]
                    [--rollout-types f32,q8_0] [--out docs]
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

TRL_RUN = r'''
import json, re, sys, time, torch
cfg = json.loads(sys.argv[1])
torch.set_num_threads(cfg["threads"])
torch.manual_seed(cfg["seed"])
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer
d, f = cfg["model_dir"], cfg["model_file"]
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32)
# transformers 5 marks a GGUF-loaded model as quantized and refuses to train (or save) it, although
# its weights are plain dequantized f32 tensors: drop the mark.
model.hf_quantizer = None
model.is_quantized = False
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
rows = [json.loads(x) for x in open(cfg["data"])]
ds = Dataset.from_list([{"prompt": [r["messages"][0]], "answer": r["messages"][1]["content"]}
                        for r in rows])
def last_int(text):
    m = re.findall(r"(?<![0-9])-?[0-9]+", text)
    return m[-1] if m else None
def reward(completions, answer, **kw):
    out = []
    for c, a in zip(completions, answer):
        text = c[0]["content"] if isinstance(c, list) else c
        got = last_int(text)
        out.append(1.0 if got is not None and int(got) == int(a) else 0.0)
    return out
args = GRPOConfig(output_dir=cfg["out"], use_cpu=True, bf16=False, fp16=False,
                  learning_rate=cfg["lr"], num_generations=cfg["group"],
                  per_device_train_batch_size=cfg["group"] * cfg["prompts"],
                  gradient_accumulation_steps=1, max_completion_length=cfg["max_new"],
                  temperature=1.0, max_steps=cfg["steps"], logging_steps=1, report_to=[],
                  save_strategy="no", shuffle_dataset=False, seed=cfg["seed"],
                  dataloader_num_workers=0, disable_tqdm=True)
trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds,
                      processing_class=tok)
t0 = time.time()
trainer.train()
secs = time.time() - t0
rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
lens = [h.get("completions/mean_length") for h in trainer.state.log_history if "reward" in h]
print("RESULT " + json.dumps({"seconds": secs, "rewards": rewards, "lengths": lens}))
'''


def ensure_venv(venv):
    py = os.path.join(venv, "bin", "python")
    probe = [py, "-c", "import trl, torch, transformers, datasets, gguf"]
    if os.path.exists(py) and subprocess.run(probe, capture_output=True).returncode == 0:
        return py
    print(f"creating {venv} (torch 2.6, trl 1.16; a large download, once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([py, "-m", "pip", "install", "-q", "torch==2.6.0", "trl==1.16.0", "datasets",
                    "gguf", "nvidia-cusparselt-cu12"], check=True)
    # torch 2.6 looks for cuSPARSELt under nvidia/cusparselt; the wheel installs cusparselt/.
    site = subprocess.run([py, "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    os.makedirs(os.path.join(site, "nvidia"), exist_ok=True)
    link = os.path.join(site, "nvidia", "cusparselt")
    if not os.path.exists(link):
        os.symlink(os.path.join(site, "cusparselt"), link)
    subprocess.run(probe, check=True)
    return py


def run_trl(py, cfg):
    p = subprocess.run([py, "-c", TRL_RUN, json.dumps(cfg)], capture_output=True, text=True,
                       timeout=3600)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    sys.exit("TRL run failed:\n" + p.stdout[-2000:] + p.stderr[-4000:])


def run_weft(weft, cfg, tmp, i, rollout_type="f32"):
    metrics = os.path.join(tmp, f"weft-{rollout_type}-{i}.jsonl")
    cmd = [weft, "rl", "--model", cfg["model"], "--task", "arithmetic", "--digits", "1",
           "--prompts-per-step", str(cfg["prompts"]), "--group-size", str(cfg["group"]),
           "--max-new-tokens", str(cfg["max_new"]), "--steps", str(cfg["steps"]),
           "--lr", str(cfg["lr"]), "--threads", str(cfg["threads"]), "--seed", str(cfg["seed"]),
           "--eval-every", "0", "--eval-prompts", str(cfg["eval_prompts"]), "--metrics", metrics,
           "--rollout-type", rollout_type]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        sys.exit("weft rl failed:\n" + p.stderr[-3000:])
    rows = [json.loads(x) for x in open(metrics) if x.strip()]
    steps = [r for r in rows if r["kind"] == "step"]
    return {"seconds": sum(r["step_s"] for r in steps), "rewards": [r["reward"] for r in steps],
            "lengths": [r["completion_len"] for r in steps],
            "ratio_deviation": [r["ratio_deviation"] for r in steps],
            "stage_seconds": {k: sum(r[k] for r in steps) for k in ["rollout_s", "train_s",
                                                                       "sync_s"]}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    ap.add_argument("--model", default=os.environ.get("WEFT_MODEL", os.path.expanduser(
        "~/.cache/weft/models/SmolLM2-135M-Instruct.Q4_1.gguf")))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--venv", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   "..", "..", "build", "trl-venv"))
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--rollout-types", default="f32",
                    help="weft runs, each alternated with TRL's: comma-separated --rollout-type "
                         "values (f32 is the reported weft run; e.g. f32,q8_0 adds quantized "
                         "rollouts)")
    a = ap.parse_args()
    types = [t.strip() for t in a.rollout_types.split(",") if t.strip()]
    if "f32" not in types:
        types.insert(0, "f32")
    py = ensure_venv(os.path.abspath(a.venv))
    eval_prompts = 32
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "prompts.jsonl")
        n = a.steps * a.prompts
        subprocess.run([a.weft, "rl", "--model", a.model, "--task", "arithmetic", "--digits", "1",
                        "--seed", str(a.seed), "--eval-prompts", str(eval_prompts),
                        "--write-sft-data", data, "--sft-examples", str(n)],
                       check=True, capture_output=True)
        cfg = {"model": a.model, "model_dir": os.path.dirname(a.model),
               "model_file": os.path.basename(a.model), "data": data, "steps": a.steps,
               "prompts": a.prompts, "group": a.group, "max_new": a.max_new, "lr": a.lr,
               "threads": a.threads, "seed": a.seed, "out": os.path.join(tmp, "trl"),
               "eval_prompts": eval_prompts}
        trl, weft = [], []
        others = {t: [] for t in types if t != "f32"}
        for i in range(a.repeat):
            t = run_trl(py, cfg)
            trl.append(t)
            print(f"TRL  run {i + 1}: {t['seconds']:.1f} s, "
                  f"{a.steps * a.prompts * a.group / t['seconds']:.2f} samples/s, "
                  f"rewards {[round(x, 3) for x in t['rewards']]}", flush=True)
            w = run_weft(a.weft, cfg, tmp, i)
            weft.append(w)
            print(f"weft run {i + 1}: {w['seconds']:.1f} s, "
                  f"{a.steps * a.prompts * a.group / w['seconds']:.2f} samples/s, "
                  f"rewards {[round(x, 3) for x in w['rewards']]}", flush=True)
            for t in others:
                w = run_weft(a.weft, cfg, tmp, i, t)
                others[t].append(w)
                print(f"weft {t} rollouts run {i + 1}: {w['seconds']:.1f} s, "
                      f"{a.steps * a.prompts * a.group / w['seconds']:.2f} samples/s, "
                      f"rewards {[round(x, 3) for x in w['rewards']]}", flush=True)
    samples = a.steps * a.prompts * a.group
    trl_sps = [samples / r["seconds"] for r in trl]
    weft_sps = [samples / r["seconds"] for r in weft]
    ratios = [w / t for w, t in zip(weft_sps, trl_sps)]
    out = {
        "benchmark": "rl_vs_trl", "date": datetime.date.today().isoformat(),
        "model": os.path.basename(a.model), "task": "1-digit addition, chat template",
        "steps": a.steps, "prompts_per_step": a.prompts, "group_size": a.group,
        "max_new_tokens": a.max_new, "lr": a.lr, "threads": a.threads, "samples_per_run": samples,
        "trl": {"version": subprocess.run([py, "-c", "import trl; print(trl.__version__)"],
                                          capture_output=True, text=True).stdout.strip(),
                "samples_per_s": trl_sps, "runs": trl},
        "weft": {"samples_per_s": weft_sps, "runs": weft},
        "ratio_weft_over_trl": ratios, "ratio_median": statistics.median(ratios),
        "weft_rollout_types": {
            t: {"samples_per_s": [samples / r["seconds"] for r in rs], "runs": rs,
                "ratio_over_trl": [samples / r["seconds"] / x for r, x in zip(rs, trl_sps)],
                "ratio_median": statistics.median(samples / r["seconds"] / x
                                                  for r, x in zip(rs, trl_sps)),
                "mean_reward": statistics.mean(x for r in rs for x in r["rewards"])}
            for t, rs in others.items()},
        "mean_reward": {"trl": statistics.mean(x for r in trl for x in r["rewards"]),
                        "weft": statistics.mean(x for r in weft for x in r["rewards"])},
    }
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.join(a.out, f"rl-vs-trl-{datetime.date.today().strftime('%Y%m%d')}")
    with open(stem + ".json", "w") as f:
        json.dump(out, f, indent=1)
    print(f"weft / TRL samples/s: {[round(r, 2) for r in ratios]} (median "
          f"{out['ratio_median']:.2f}x); mean reward TRL {out['mean_reward']['trl']:.3f}, "
          f"weft {out['mean_reward']['weft']:.3f}; wrote {stem}.json")
    for t, v in out["weft_rollout_types"].items():
        print(f"weft with {t} rollouts / TRL: {[round(r, 2) for r in v['ratio_over_trl']]} "
              f"(median {v['ratio_median']:.2f}x); mean reward {v['mean_reward']:.3f}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(1, 2, figsize=(11, 4))
        names = ["TRL GRPOTrainer", "weft rl (sync)"] + [f"weft rl, {t} rollouts" for t in others]
        ax[0].bar(names, [statistics.median(trl_sps), statistics.median(weft_sps)] +
                  [statistics.median(v["samples_per_s"])
                   for v in out["weft_rollout_types"].values()])
        ax[0].tick_params(axis="x", labelrotation=10)
        ax[0].set_ylabel("samples / s (median of runs)")
        ax[0].set_title(f"GRPO on SmolLM2-135M, {a.threads} threads")
        for r in trl:
            ax[1].plot(range(1, len(r["rewards"]) + 1), r["rewards"], "C0", alpha=0.6)
        for r in weft:
            ax[1].plot(range(1, len(r["rewards"]) + 1), r["rewards"], "C1", alpha=0.6)
        ax[1].plot([], [], "C0", label="TRL")
        ax[1].plot([], [], "C1", label="weft")
        ax[1].set_xlabel("step")
        ax[1].set_ylabel("mean reward of the step's samples")
        ax[1].legend()
        fig.tight_layout()
        fig.savefig(stem + ".png", dpi=110)
    except ImportError:
        print("matplotlib missing: no PNG")


if __name__ == "__main__":
    main()
