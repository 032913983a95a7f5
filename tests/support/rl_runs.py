"""What the `weft rl` chaos tests share: a tiny generated model with a dataset of prompts, a reward
program that pays for anything but dots, and a run's outcome read back from its files."""
import os
import socket
import subprocess

from cli_checks import read_jsonl

# Rewards the share of characters that are not dots (continuous: groups always differ).
REWARD_NOT_DOTS = """import json, sys
for line in sys.stdin:
    r = json.loads(line)
    c = r["completion"]
    print(json.dumps({"id": r["id"], "reward": sum(ch != "." for ch in c) / max(1, len(c))}),
          flush=True)
"""


def tiny_setup(make_model, tmp, reward=REWARD_NOT_DOTS, prompts=120):
    """Writes tiny.gguf, prompts.jsonl and reward.py into `tmp`; returns their paths."""
    model = os.path.join(tmp, "tiny.gguf")
    subprocess.run([make_model, model], check=True, capture_output=True)
    data = os.path.join(tmp, "prompts.jsonl")
    with open(data, "w") as f:
        for i in range(prompts):
            f.write(f'{{"prompt": "Say three dots ({i}).", "answer": "..."}}\n')
    script = os.path.join(tmp, "reward.py")
    with open(script, "w") as f:
        f.write(reward)
    return model, data, script


def outcome(tmp, tag):
    """(steps as (step, samples, reward, loss), evals as (step, pass@1), exported weights) of the
    run that wrote TAG.jsonl and TAG.gguf into `tmp`."""
    rows = read_jsonl(os.path.join(tmp, tag + ".jsonl"))
    steps = [(r["step"], r["samples"], r["reward"], r["loss"]) for r in rows if r["kind"] == "step"]
    evals = [(r["step"], r["pass_at_1"]) for r in rows if r["kind"] == "eval"]
    with open(os.path.join(tmp, tag + ".gguf"), "rb") as f:
        return steps, evals, f.read()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
