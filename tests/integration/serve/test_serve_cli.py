#!/usr/bin/env python3
"""`weft serve` options as a new user writes them: a --config file is applied (top level or
[serve], dashes or underscores; flags win), a missing or wrong config file is refused, and
contradictory worker options are refused rather than one of them dropped.

Usage: test_serve_cli.py --weft PATH/TO/weft     (exit 77 = skipped: no model; a failure under CI=true)
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
from weft_serve import default_model_path, post_json  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(p):
    """SIGTERM, then SIGKILL if it does not end within 30 s."""
    p.terminate()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def run_to_exit(weft, args, timeout=60):
    p = subprocess.run([weft, "serve"] + args, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def serve_url(weft, args, timeout=240):
    """Starts `weft serve args`, returns the URL of its ready line, stops it."""
    p = subprocess.Popen([weft, "serve"] + args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.time() + timeout
        while time.time() < deadline:
            line = p.stdout.readline()
            if not line and p.poll() is not None:
                return None
            m = re.match(r"weft-serve-ready url=(\S+)", line or "")
            if m:
                return m.group(1)
        return None
    finally:
        stop(p)


def raw_request(port, body, stream):
    """Opens a connection and sends a completion request; returns the socket (not read yet)."""
    s = socket.create_connection(("127.0.0.1", port))
    data = json.dumps(dict(body, stream=stream)).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


def read_response(sock):
    """One whole HTTP response with a Content-Length (headers and body) from `sock`."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data.decode(errors="replace")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    m = re.search(rb"Content-Length: (\d+)", head)
    want = int(m.group(1)) if m else 0
    while len(body) < want:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return (head + b"\r\n\r\n" + body).decode(errors="replace")


def check_http_queue(weft, check):
    """--http-threads 1 --http-queue 1: one stream holds the thread, one connection waits, the next
    one is answered 503 with Retry-After at once; the waiting one is served afterwards."""
    p = free_port()
    proc = subprocess.Popen([weft, "serve", "--port", str(p), "--http-threads", "1", "--http-queue", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            line = proc.stdout.readline()
            if line.startswith("weft-serve-ready") or (not line and proc.poll() is not None):
                break
        body = {"prompt": "Tell me a long story.", "max_tokens": 48, "ignore_eos": True}
        holder = raw_request(p, body, stream=True)
        got = b""
        while b"data:" not in got:
            got += holder.recv(4096)
        waiter = raw_request(p, dict(body, max_tokens=2), stream=False)
        time.sleep(0.3)
        t0 = time.time()
        refused = raw_request(p, dict(body, max_tokens=2), stream=False)
        refused.settimeout(10)
        answer = read_response(refused)
        quick = time.time() - t0 < 5
        check(answer.startswith("HTTP/1.1 503") and "Retry-After: 1" in answer and "server_busy" in answer
              and quick, "a connection beyond --http-queue gets 503 with Retry-After at once (%r)" % answer[:60])
        refused.close()
        holder.close()
        waiter.settimeout(120)
        served = read_response(waiter)
        check(served.startswith("HTTP/1.1 200"), "the waiting connection is served once the thread is free (%r)"
              % served[:40])
        waiter.close()
    finally:
        stop(proc)


def check_clean_stop(weft, check):
    """Ctrl-C of a healthy server is not a failure: nothing is restarted or migrated on the way
    down, and the process exits 0."""
    proc = subprocess.Popen([weft, "serve", "--port", "0", "--workers", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline:
        line = proc.stdout.readline()
        if line.startswith("weft-serve-ready") or (not line and proc.poll() is not None):
            break
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    noisy = [l for l in err.splitlines() if "restarting" in l or "migrating" in l or " lost (" in l]
    check(proc.returncode == 0 and not noisy,
          "a clean stop exits 0 and restarts or migrates nothing (rc %s, %s)" % (proc.returncode, noisy[:2]))


def thread_policies(pid):
    """[(thread name, scheduling policy)] of every thread of process `pid`."""
    out = []
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                name = f.read().strip()
            out.append((name, os.sched_getscheduler(int(tid))))
        except (OSError, ProcessLookupError):
            pass  # the thread ended meanwhile
    return out


def children_of(pid):
    kids = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open("/proc/%s/stat" % p) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if ppid == pid:
                kids.append(int(p))
    return kids


def check_helper_sched(weft, check):
    """--helper-sched batch (the default): the head's and the worker's CAF network, scheduler and
    clock threads run in SCHED_BATCH, the worker's compute threads (its engine thread and the CPU
    pool's) in SCHED_OTHER; --helper-sched normal leaves every thread in SCHED_OTHER."""
    probe = subprocess.run([sys.executable, "-c",
                            "import os; os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))"],
                           capture_output=True)
    modes = ("batch", "normal")
    if probe.returncode != 0:
        # A sandbox that refuses SCHED_BATCH: weft warns and runs as with normal (not a failure).
        print("skip --helper-sched batch: this machine refuses SCHED_BATCH")
        modes = ("normal",)
    for mode in modes:
        args = [weft, "serve", "--port", "0"] + ([] if mode == "batch" else ["--helper-sched", "normal"])
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            deadline = time.time() + 240
            ready = False
            while time.time() < deadline:
                line = proc.stdout.readline()
                if line.startswith("weft-serve-ready"):
                    ready = True
                    break
                if not line and proc.poll() is not None:
                    break
            check(ready, "--helper-sched %s: the server starts" % mode)
            if not ready:
                continue
            head = thread_policies(proc.pid)
            workers = [thread_policies(c) for c in children_of(proc.pid)]
            check(len(workers) == 1, "--helper-sched %s: one worker process (%d)" % (mode, len(workers)))
            worker = workers[0] if workers else []
            caf_helpers = [pol for name, pol in head + worker if name in ("caf.multiplexer", "caf.clock")]
            compute = [name for name, pol in worker if pol == os.SCHED_OTHER and name == "caf.actor"]
            if mode == "batch":
                check(caf_helpers and all(p == os.SCHED_BATCH for p in caf_helpers),
                      "batch: every CAF network/scheduler/clock thread is SCHED_BATCH (%s)" % caf_helpers)
                check(len(compute) >= 1, "batch: the worker's compute threads are SCHED_OTHER (%d)" % len(compute))
                check(any(pol == os.SCHED_BATCH for name, pol in worker if name == "caf.actor"),
                      "batch: the worker's other detached actors stay SCHED_BATCH")
            else:
                check(all(pol == os.SCHED_OTHER for _, pol in head + worker),
                      "normal: every thread is SCHED_OTHER")
        finally:
            stop(proc)


def check_chat_template(weft, d, check):
    """--chat-template FILE replaces the model's template (a Jinja file, run as Hugging Face runs
    it); a missing or broken file is refused at start, naming the problem."""
    rc, out = run_to_exit(weft, ["--chat-template", "/nope.jinja"])
    check(rc == 2 and "/nope.jinja" in out, "a missing --chat-template file is refused (rc %d)" % rc)
    broken = os.path.join(d, "broken.jinja")
    with open(broken, "w") as f:
        f.write("{% for m in messages %}{{ m.content }}")
    rc, out = run_to_exit(weft, ["--chat-template", broken])
    check(rc == 2 and "endfor" in out, "a template without its endfor is refused naming it (rc %d)" % rc)
    good = os.path.join(d, "mine.jinja")
    with open(good, "w") as f:
        f.write("{%- for m in messages %}\n[{{ m.role | upper }}] {{ m.content | trim }}\n"
                "{%- endfor %}{% if add_generation_prompt %}\n[ASSISTANT]{% endif %}\n")
    p = subprocess.Popen([weft, "serve", "--port", "0", "--chat-template", good],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = None
        deadline = time.time() + 240
        while time.time() < deadline and url is None:
            line = p.stdout.readline()
            if not line and p.poll() is not None:
                break
            m = re.match(r"weft-serve-ready url=(\S+)", line or "")
            url = m.group(1) if m else None
        check(url is not None, "serves with --chat-template")
        if url:
            toks = post_json(url, "/tokenize", {"messages": [{"role": "user", "content": " hi "}],
                                                "add_generation_prompt": True})[1]["tokens"]
            text = post_json(url, "/detokenize", {"tokens": toks})[1]["content"]
            check(text == "[USER] hi[ASSISTANT]",  # trim_blocks and the dashes eat the newlines
                  "the file's template renders the prompt: %r" % text)
    finally:
        stop(p)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    args = ap.parse_args()
    if not os.path.exists(default_model_path()):
        if os.environ.get("CI", "") not in ("", "0", "false"):
            print("FAIL: CI=true and the default model is missing")
            return 1
        print("SKIP: default model not found (scripts/fetch_model.sh)")
        return 77
    failures = []

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as d:
        # Each spelling users write: top level with dashes, [serve] with underscores.
        for name, text in [("top.toml", "port = {p}\nmax-outstanding = 64\n"),
                           ("section.toml", "[serve]\nport = {p}\nmax_outstanding = 64\nno_prefix_cache = true\n")]:
            p = free_port()
            path = os.path.join(d, name)
            with open(path, "w") as f:
                f.write(text.format(p=p))
            url = serve_url(args.weft, ["--config", path])
            check(url == "http://127.0.0.1:%d" % p, "%s: serves on the config's port %d (got %s)" % (name, p, url))
        # The command line wins over the file.
        p_file, p_flag = free_port(), free_port()
        path = os.path.join(d, "win.toml")
        with open(path, "w") as f:
            f.write("port = %d\n" % p_file)
        url = serve_url(args.weft, ["--config", path, "--port", str(p_flag)])
        check(url == "http://127.0.0.1:%d" % p_flag, "a flag wins over the config file (got %s)" % url)

        rc, out = run_to_exit(args.weft, ["--config", "/nope.toml"])
        check(rc != 0 and "/nope.toml" in out, "a missing config file is refused (rc %d)" % rc)
        bad = os.path.join(d, "bad.toml")
        with open(bad, "w") as f:
            f.write("prot = 8105\n")
        rc, out = run_to_exit(args.weft, ["--config", bad])
        check(rc == 2 and "unknown option 'prot'" in out, "an unknown key is refused by name (rc %d)" % rc)
        with open(bad, "w") as f:
            f.write("[server]\nport = 8105\n")
        rc, out = run_to_exit(args.weft, ["--config", bad])
        check(rc == 2 and "unknown section [server]" in out, "an unknown section is refused (rc %d)" % rc)
        with open(bad, "w") as f:
            f.write("workers = 2\nprefill = 1\ndecode = 1\n")
        rc, out = run_to_exit(args.weft, ["--config", bad])
        check(rc == 2 and "exclude each other" in out, "workers + prefill/decode from a file are refused (rc %d)" % rc)

        check_chat_template(args.weft, d, check)

    check_http_queue(args.weft, check)
    check_clean_stop(args.weft, check)
    check_helper_sched(args.weft, check)

    rc, out = run_to_exit(args.weft, ["--workers", "2", "--prefill", "1", "--decode", "1"])
    check(rc == 2 and "exclude each other" in out, "--workers with --prefill/--decode is refused (rc %d)" % rc)
    rc, out = run_to_exit(args.weft, ["--prefill", "0", "--decode", "1"])
    check(rc != 0 and "--prefill" in out, "--prefill 0 is refused (rc %d)" % rc)
    rc, out = run_to_exit(args.weft, ["--device", "tpu"])
    check(rc == 2 and "no backend 'tpu'" in out, "an unknown --device is refused naming it (rc %d)" % rc)
    rc, out = run_to_exit(args.weft, ["--device", "cuda:x"])
    check(rc == 2 and "BACKEND:INDEX" in out, "a malformed --device is refused (rc %d)" % rc)
    rc, out = run_to_exit(args.weft, ["--device", "cuda", "--cache-shards", "1"])
    check(rc == 2 and "cache shards run on the CPU only" in out,
          "--device cuda with cache shards is refused (rc %d)" % rc)
    rc, out = run_to_exit(args.weft, ["--help"])
    bounds = {m.group(1): m.group(2) for m in re.finditer(r"--(prefill|decode) INT:INT in \[(\d+) - ", out)}
    check(rc == 0 and bounds == {"prefill": "1", "decode": "1"},
          "--help shows 1 as the lower bound of --prefill/--decode (got %s)" % bounds)
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
