#!/usr/bin/env python3
"""Agentic rollouts through the CLI (docs/rl.md, "Agentic rollouts"): a generated 4-layer model
is fine-tuned with `weft train` on solved lookup problems that `weft rl --task lookup --tools
lookup --write-sft-data` writes (each calls <lookup>word</lookup>, reads the tool's
<result>value</result> and answers with it), then post-trained with the lookup tool actor. The
values are known only to the tool, so every right answer went through a tool call.

Checks: the warm model calls the tool and answers right most of the time (held-out greedy pass@1
with tools); every step calls the tool; the update is on-policy to rounding (a tool's tokens in the
loss would put the ratio far from 1, their behaviour log-prob being 0); most of a continuation's
context comes from the prefix cache; the Search-R1-style batch-synchronous turns (--tool-turns
batch) and two rollout agents with a 100 ms tool, one of them SIGKILLed mid-run, give the same run
bit for bit (sync mode, f16 rollout weights), as do trajectory priority with a cap on each
rollout engine's sequences (in one process, and on the two agents); async
mode keeps its staleness bound; a Python program with the same table, given as --tool-cmd
lookup=... (two processes: --tool-procs 2), and the same table behind an HTTP endpoint
(--tool-url lookup=http://...), give the same samples as the built-in tool; options that need
--tools are refused without it.

Usage: test_rl_tools.py --weft PATH/TO/weft --make-model PATH/TO/weft_make_tiny_model
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "support"))
from cli_checks import (check, finish, read_jsonl, run_or_exit, run_watching,  # noqa: E402
                        run_weft)
from rl_runs import free_port, status_asker  # noqa: E402


# The built-in lookup table (gpu/rl/tools.cpp) as a tool of your own: FNV-1a over the word, then
# the tasks' splitmix64 mix, value 1..99.
TABLE_PY = r"""
import json, sys
M = (1 << 64) - 1
def mix(seed, stream, index):
    z = seed ^ ((stream * 0xD1B54A32D192ED03) & M) ^ ((index * 0x9E3779B97F4A7C15) & M)
    z = (z + 0x9E3779B97F4A7C15) & M
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    return z ^ (z >> 31)
def value(key):
    k = key.strip().strip("'\"").lower()
    if not 3 <= len(k) <= 12 or not all("a" <= c <= "z" for c in k):
        return "error: no entry for '%s' (keys are words of 3 to 12 letters)" % key.strip()[:40]
    h = 0xcbf29ce484222325
    for c in k.encode():
        h = ((h ^ c) * 0x100000001b3) & M
    return str(1 + mix(h, 0x7001, 0) % 99)
"""
# ... as a program speaking JSON lines (--tool-cmd),
LOOKUP_PY = TABLE_PY + r"""
for line in sys.stdin:
    r = json.loads(line)
    print(json.dumps({"id": r["id"], "result": value(r["args"])}), flush=True)
"""
# ... and as an HTTP endpoint (--tool-url; argv[1]: a file to write its port to).
LOOKUP_HTTP_PY = TABLE_PY + r"""
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        r = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body = json.dumps({"result": value(r["args"])}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(srv.server_address[1]))
import os
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
srv.serve_forever()
"""


def steps_of(path):
    return [r for r in read_jsonl(path) if r["kind"] == "step"]


def evals_of(path):
    return [r for r in read_jsonl(path) if r["kind"] == "eval"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    ap.add_argument("--make-model", required=True)
    a = ap.parse_args()
    w = a.weft
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "tiny.gguf")
        run_or_exit([a.make_model, base, "--layers", "4", "--embd", "128"])
        task = ["--task", "lookup", "--words", "1", "--tools", "lookup", "--prompt-format", "raw",
                "--eval-prompts", "50", "--seed", "0"]

        # Options that shape tool calls need --tools; the lookup task needs the lookup tool.
        for bad, says in [(["--tool-cmd", "search"], "is not NAME=COMMAND"),
                          (["--tool-cmd", "Web=x"], "tool name 'Web'"),
                          (["--task", "lookup"], "add --tools lookup"),
                          (["--max-tool-calls", "2"], "give --tools too"),
                          (["--tool-turns", "batch"], "give --tools too"),
                          (["--tool-url", "search=ftp://x/"], "is not http://host[:port][/path]"),
                          (["--tool-url", "lookup=http://a/", "--tool-cmd", "lookup=cat"],
                           "given twice"),
                          (["--tool-concurrency", "4"], "give --tools too"),
                          (["--tools", "calc", "--tool-procs", "2"], "give --tool-cmd too"),
                          (["--tools", "calc", "--tool-concurrency", "2"], "give --tool-url too"),
                          (["--tools", "calc,search"], "unknown tool 'search'"),
                          (["--tools", "calc", "--tool-latency-ms", "2000", "--tool-timeout-s",
                            "1"], "every call would time out"),
                          (["--words", "3"], "--task lookup"),
                          (["--tools", "calc", "--tool-workers", "2"],
                           "--tool-workers runs the tools")]:
            rc, out = run_weft(w, "rl", ["--model", base, "--steps", "1"] + bad)
            check(rc == 2 and says in out, f"refused: {' '.join(bad)} ({out.strip()[-120:]})")
        rc, out = run_weft(w, "rl", ["--help"])
        check(rc == 0 and "--tools" in out and "--tool-turns" in out, "--help lists the tool options")

        sft = os.path.join(tmp, "sft.jsonl")
        run_or_exit([w, "rl", "--model", base] + task + ["--write-sft-data", sft,
                                                         "--sft-examples", "5000"])
        lines = [json.loads(x) for x in open(sft)]
        check(len(lines) == 5000 and all("<lookup>" in x["completion"] and "<result>" in
                                         x["completion"] for x in lines),
              "--write-sft-data with --tools writes transcripts that call the tool")
        warm = os.path.join(tmp, "warm.gguf")
        run_or_exit([w, "train", "--model", base, "--data", sft, "--steps", "150", "--lr", "3e-3",
                     "--warmup-steps", "10", "--batch-tokens", "4096", "--micro-batch-tokens",
                     "2048", "--threads", "2", "--save", warm, "--save-type", "f32"])

        # f16 rollout weights: weft's own kernels, whose results do not depend on the batch's
        # shape, so when a continuation joins a batch changes no bit (f32 goes through OpenBLAS).
        run = ["--model", warm] + task + ["--steps", "3", "--prompts-per-step", "8",
                                          "--group-size", "4", "--max-new-tokens", "48",
                                          "--lr", "5e-5", "--threads", "2", "--rollout-type", "f16"]
        m1 = os.path.join(tmp, "one.jsonl")
        run_or_exit([w, "rl"] + run + ["--eval-every", "3", "--metrics", m1])
        rows, ev = steps_of(m1), evals_of(m1)
        check(len(rows) == 3, "three steps")
        check(ev and ev[0]["pass_at_1"] >= 0.3 and ev[0]["tool_calls"] >= 40,
              f"the warm model answers held-out problems through the tool: {ev[:1]}")
        check(all(r["tool_calls"] >= r["samples"] // 2 for r in rows),
              f"every step calls the tool: {[r['tool_calls'] for r in rows]}")
        check(all(r["tool_tokens"] > 0 and r["completion_tokens"] > 0 for r in rows),
              "tool results are counted apart from the generated tokens")
        check(all(r["ratio_deviation"] < 1e-3 for r in rows),
              f"on-policy to rounding, tool tokens out of the loss: "
              f"{[r['ratio_deviation'] for r in rows]}")
        check(all(r["tool_kv_reuse"] > 0.5 for r in rows),
              f"continuations reuse the KV of the turn before the call: "
              f"{[round(r['tool_kv_reuse'], 3) for r in rows]}")
        check(any(0.0 < r["reward"] < 1.0 for r in rows), "rewards spread, so the weights move")

        def same_run(path, what):
            # The same run bit for bit, whatever the timing of the tools (docs/rl.md, "Agentic
            # rollouts": with f16 rollout weights).
            other = steps_of(path)
            keys = ["reward", "tool_calls", "tool_tokens", "completion_tokens", "loss",
                    "grad_norm", "ratio_deviation"]
            diff = [(x["step"], k, x[k], y[k]) for x, y in zip(rows, other) for k in keys
                    if x[k] != y[k]]
            check(len(other) == len(rows) and not diff, f"{what}: the same run bit for bit {diff}")
            return other

        # A tool of your own: a Python program with the built-in lookup's table replaces it.
        mine = os.path.join(tmp, "lookup.py")
        with open(mine, "w") as f:
            f.write(LOOKUP_PY)
        m5 = os.path.join(tmp, "own.jsonl")
        rc, out = run_weft(w, "rl", run + ["--eval-every", "0", "--tool-cmd",
                                           f"lookup=python3 {mine}", "--tool-procs", "2",
                                           "--metrics", m5])
        check(rc == 0 and "tool lookup: `python3" in out and "JSON lines, 2 processes" in out,
              f"--tool-cmd runs the program (2 processes) as the lookup tool "
              f"({out.strip()[-200:]})")
        if rc == 0:
            same_run(m5, "a Python lookup tool (JSON lines) instead of the built-in")
        # The same table behind an HTTP endpoint.
        web = os.path.join(tmp, "lookup_http.py")
        with open(web, "w") as f:
            f.write(LOOKUP_HTTP_PY)
        port_file = os.path.join(tmp, "lookup.port")
        server = subprocess.Popen([sys.executable, web, port_file])
        try:
            for _ in range(100):
                if os.path.exists(port_file):
                    break
                time.sleep(0.1)
            url = f"http://127.0.0.1:{open(port_file).read().strip()}/lookup"
            m7 = os.path.join(tmp, "http.jsonl")
            rc, out = run_weft(w, "rl", run + ["--eval-every", "0", "--tool-url", f"lookup={url}",
                                               "--tool-concurrency", "4", "--metrics", m7])
            check(rc == 0 and f"tool lookup: POST {url} (4 calls at once)" in out,
                  f"--tool-url calls the endpoint as the lookup tool ({out.strip()[-200:]})")
            if rc == 0:
                same_run(m7, "a lookup tool behind an HTTP endpoint instead of the built-in")
        finally:
            server.kill()
            server.wait()
        # Heddle's trajectory-level scheduling with 4 sequences a pass: requests queue and are
        # preempted in priority order, which changes when tokens are computed, not which.
        m6 = os.path.join(tmp, "priority.jsonl")
        rc, out = run_weft(w, "rl", run + ["--eval-every", "0", "--rollout-max-running", "4",
                                           "--trajectory-priority", "--metrics", m6])
        check(rc == 0 and "trajectory priority: rollout engines run the trajectories predicted "
              "longest first, 4 sequences a pass" in out,
              f"--trajectory-priority --rollout-max-running 4 runs ({out.strip()[-200:]})")
        if rc == 0:
            same_run(m6, "--rollout-max-running 4 --trajectory-priority")
        m2 = os.path.join(tmp, "batch.jsonl")
        run_or_exit([w, "rl"] + run + ["--eval-every", "0", "--tool-turns", "batch",
                                       "--metrics", m2])
        same_run(m2, "--tool-turns batch")
        # Two rollout agents (each capped at 6 sequences a pass, trajectory priority: the
        # priorities travel in the rollout messages); agent 0's node process is SIGKILLed once
        # step 1 is reported, while step 2's samples generate or wait for the tool: its rollouts
        # — continuations after a call among them — are replayed on agent 1.
        m3 = os.path.join(tmp, "agents.jsonl")
        pids, killed = {}, []
        port = free_port()
        ask, status = status_asker(w, port, "step 2/")

        def on_line(line):
            ask(line)
            m = re.search(r"rollout-node-(\d+) started \(pid (\d+)\)", line)
            if m:
                pids[int(m.group(1))] = int(m.group(2))
            if not killed and "step 1/" in line and 0 in pids:
                os.kill(pids[0], signal.SIGKILL)
                killed.append(pids[0])
        rc, out = run_watching([w, "rl"] + run + ["--eval-every", "0", "--agents", "2",
                                                  "--tool-latency-ms", "100", "--metrics", m3,
                                                  "--metrics-port", str(port),
                                                  "--rollout-max-running", "6",
                                                  "--trajectory-priority"],
                               on_line, timeout=600)
        table = status["table"].stdout if "table" in status else ""
        tools = (json.loads(status["json"].stdout).get("tools") or {}) if "json" in status and \
            status["json"].returncode == 0 else {}
        check("TOOL" in table and "built-in" in table and
              any(t["tool"] == "lookup" and t["calls"] > 0 for t in tools.get("tools", [])),
              f"`weft cluster status --rl` lists the tool actors: {table[-300:]}")
        check(rc == 0 and killed, f"two agents, agent 0 SIGKILLed after step 1: exit {rc} "
                                  f"({out.strip()[-300:] if rc else ''})")
        ag = same_run(m3, "two rollout agents, a 100 ms tool, one killed") if rc == 0 else []
        if ag:
            check(ag[-1]["agents_lost"] >= 1,
                  f"the metrics count the lost agent ({ag[-1]['agents_lost']} lost, "
                  f"{ag[-1]['rollouts_moved']} rollouts moved)")
        check(all(r["tool_kv_reuse"] > 0.5 for r in ag),
              f"agents keep a group's continuations where its KV is: "
              f"{[round(r['tool_kv_reuse'], 3) for r in ag]}")
        # The tools on two tool workers, each on a tool node of the run's cluster; tool-node-0's
        # process is SIGKILLed once step 1 is reported: its calls go to the other worker (or to
        # its restarted self) and the run is the same, bit for bit.
        m8 = os.path.join(tmp, "toolworkers.jsonl")
        tpids, tkilled = {}, []
        port2 = free_port()
        ask2, status2 = status_asker(w, port2, "step 2/")

        def on_line2(line):
            ask2(line)
            m = re.search(r"tool-node-(\d+) started \(pid (\d+)\)", line)
            if m:
                tpids[int(m.group(1))] = int(m.group(2))
            if not tkilled and "step 1/" in line and 0 in tpids:
                # 0.5 s into step 2, while its calls are in flight (most of the time: the test
                # asks for the same bits either way).
                threading.Timer(0.5, os.kill, (tpids[0], signal.SIGKILL)).start()
                tkilled.append(tpids[0])
        rc, out = run_watching([w, "rl"] + run + ["--eval-every", "0", "--agents", "1",
                                                  "--tool-workers", "2", "--tool-latency-ms",
                                                  "100", "--metrics", m8, "--metrics-port",
                                                  str(port2)],
                               on_line2, timeout=600)
        check(rc == 0 and tkilled and "tool worker 0 ready" in out and
              "tool worker 1 ready" in out,
              f"two tool workers, tool-node-0 SIGKILLed after step 1: exit {rc} "
              f"({out.strip()[-300:] if rc else ''})")
        tw = (json.loads(status2["json"].stdout).get("tool_workers") or {}) \
            if "json" in status2 and status2["json"].returncode == 0 else {}
        check(len(tw.get("workers", [])) == 2 and
              sum(x["calls"] for x in tw["workers"]) > 0 and
              "TOOL WORKER" in (status2["table"].stdout if "table" in status2 else ""),
              f"`weft cluster status --rl` lists the tool workers and their calls: {tw}")
        tr = same_run(m8, "two tool workers, one killed") if rc == 0 else []
        if tr:
            check(tr[-1]["tool_restarts"] >= 1,
                  f"the metrics count the lost tool worker ({tr[-1]['tool_restarts']} lost, "
                  f"{tr[-1]['tool_calls_resent']} calls sent again)")
        m4 = os.path.join(tmp, "async.jsonl")
        run_or_exit([w, "rl"] + run + ["--eval-every", "0", "--mode", "async",
                                       "--max-staleness", "1", "--tool-latency-ms", "20",
                                       "--metrics", m4])
        asy = steps_of(m4)
        check(len(asy) == 3 and all(r["staleness_max"] <= 1 and r["tool_calls"] > 0 for r in asy),
              "async mode with tools keeps the staleness bound")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
