"""What the `weft rl` chaos tests share: a tiny generated model with a dataset of prompts, a reward
program that pays for anything but dots, and a run's outcome read back from its files."""
import os
import shutil
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


def reward_not_dots(delay_s):
    """REWARD_NOT_DOTS sleeping `delay_s` a sample, so that a step lasts long enough for a fault
    injected from the run's output to land inside the run."""
    return (REWARD_NOT_DOTS.replace("import json, sys\n", "import json, sys, time\n")
            .replace('    c = r["completion"]\n',
                     f'    c = r["completion"]\n    time.sleep({delay_s})\n'))


def status_asker(weft, port, at_line):
    """A run_watching callback that asks `weft cluster status --rl` of the run on `port`, as a
    table and as JSON, once a line of the run's output contains `at_line`; returns (callback,
    dict that then holds the two CompletedProcess as "table" and "json")."""
    got = {}

    def on_line(line):
        if got or at_line not in line:
            return
        url = f"http://127.0.0.1:{port}"
        got["table"] = subprocess.run([weft, "cluster", "status", "--rl", url],
                                      capture_output=True, text=True, timeout=30)
        got["json"] = subprocess.run([weft, "cluster", "status", "--rl", url, "--json"],
                                     capture_output=True, text=True, timeout=30)
    return on_line, got


def netns_usable():
    """Whether this process may create network namespaces (root, iproute2, nsenter)."""
    return (os.geteuid() == 0 and shutil.which("nsenter") is not None and
            subprocess.run(["ip", "netns", "list"], capture_output=True).returncode == 0)


def set_links(pid, up):
    """Every interface but loopback of process `pid`'s network namespace down (a cut) or up;
    returns their names."""
    enter = ["nsenter", f"--net=/proc/{pid}/ns/net"]
    out = subprocess.run(enter + ["ip", "-o", "link", "show"], capture_output=True, text=True)
    links = [l.split(": ")[1].split("@")[0] for l in out.stdout.splitlines() if ": " in l]
    links = [l for l in links if l != "lo"]
    for l in links:
        subprocess.run(enter + ["ip", "link", "set", l, "up" if up else "down"], check=True)
    return links
