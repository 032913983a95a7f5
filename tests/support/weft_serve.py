"""Starts and stops `weft serve` for Python tests (integration, chaos, benchmarks).

    with WeftServer(weft_bin, ["--workers", "2"]) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request


def post_json(url, path, body, timeout=300):
    """POSTs a JSON body; (HTTP status, parsed JSON reply), error statuses included."""
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read().decode())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode() or "{}")


def missing_requirements(*modules):
    """Exit code when the default model or a Python module is missing: 77 (CTest: skipped), or 1
    under CI=true where every tier must run; None when everything is there."""
    import importlib
    ci = os.environ.get("CI", "") not in ("", "0", "false")
    if not os.path.exists(default_model_path()):
        print("FAIL: CI=true and the default model is missing" if ci else "SKIP: no default model")
        return 1 if ci else 77
    for m in modules:
        try:
            importlib.import_module(m)
        except ImportError as e:
            print(f"{'FAIL' if ci else 'SKIP'}: {e} (scripts/setup.sh --test)")
            return 1 if ci else 77
    return None


def default_model_path():
    if os.environ.get("WEFT_MODEL"):
        return os.environ["WEFT_MODEL"]
    cache = os.environ.get("WEFT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "weft")
    return os.path.join(cache, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


class WeftServer:
    """A `weft serve` child process on a free port; `url` is set once it printed its ready line."""

    def __init__(self, weft_bin, args=(), ready_timeout_s=240, env=None):
        self.weft_bin = weft_bin
        self.args = list(args)
        self.ready_timeout_s = ready_timeout_s
        self.env = dict(os.environ, **(env or {}))
        self.proc = None
        self.url = None
        self.ready_line = None
        self.log_lines = []

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        cmd = [self.weft_bin, "serve", "--port", "0"] + self.args
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        deadline = time.time() + self.ready_timeout_s
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                if self.proc.poll() is not None:
                    raise RuntimeError("weft serve exited with %s:\n%s" % (self.proc.returncode, "".join(self.log_lines[-40:])))
                continue
            m = re.match(r"weft-serve-ready url=(\S+)", line)
            if m:
                self.url = m.group(1)
                self.ready_line = line.strip()
                return
        self.stop()
        raise RuntimeError("weft serve was not ready within %d s:\n%s" % (self.ready_timeout_s, "".join(self.log_lines[-40:])))

    def _drain_stderr(self):
        for line in self.proc.stderr:
            self.log_lines.append(line)
            if os.environ.get("WEFT_TEST_VERBOSE"):
                sys.stderr.write(line)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    # -- small HTTP helpers (raw, to test what a client library would hide) --

    def request(self, method, path, body=None, headers=None, timeout=120):
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def admin(self):
        status, body = self.request("GET", "/admin/cluster")
        assert status == 200, body
        return json.loads(body)

    def metrics(self):
        """Prometheus text -> {(name, frozenset(labels)): value}."""
        status, body = self.request("GET", "/metrics")
        assert status == 200, body
        out = {}
        for line in body.splitlines():
            if not line or line.startswith("#"):
                continue
            m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$', line)
            if not m:
                continue
            labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
            out[(m.group(1), labels)] = float(m.group(4))
        return out

    def metric_sum(self, name):
        return sum(v for (n, _), v in self.metrics().items() if n == name)

    def metric_sum_where(self, name, **labels):
        """Sum of the series of `name` whose labels include all of `labels`."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.metrics().items() if n == name and want <= set(ls))

    def disconnect_mid_stream(self, prompt="Tell me a long story.", max_tokens=400, events=3,
                              timeout_s=20, stream=True):
        """Starts a completion on a raw socket and hangs up: after `events` SSE events when
        streaming, after the response headers otherwise (a non-streaming request has started
        generating then). Waits up to `timeout_s` for the server to count this disconnect; returns
        how many disconnects it counted since the request was sent (0 if it never noticed)."""
        before = self.metric_sum("weft_client_disconnects_total")
        s = socket.create_connection(("127.0.0.1", int(self.url.rsplit(":", 1)[1])))
        body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": stream,
                           "ignore_eos": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while (got.count(b"data:") < events) if stream else (b"\r\n\r\n" not in got):
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        s.close()
        counted = 0
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            counted = self.metric_sum("weft_client_disconnects_total") - before
            if counted >= 1:
                break
            time.sleep(0.1)
        return counted

    def wait_kv_free(self, timeout_s=30):
        """Waits until no KV block is referenced on any worker; returns the last used count."""
        deadline = time.time() + timeout_s
        used = None
        while time.time() < deadline:
            used = sum(w["kv_blocks_used"] for w in self.admin()["router"]["workers"])
            if used == 0:
                return 0
            time.sleep(0.3)
        return used


def parse_test_args(add_args=None):
    """Parses `--weft BIN` (plus what `add_args(parser)` adds); returns (args, the rest of argv for
    unittest), or (None, rest) when the default model is not fetched: the caller then returns 77,
    CTest's skip code."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    if add_args:
        add_args(ap)
    args, rest = ap.parse_known_args()
    if not os.path.exists(default_model_path()):
        if os.environ.get("CI", "") not in ("", "0", "false"):
            # Under CI the model is part of the setup: its absence is a failure, not a skip.
            print("FAIL: CI=true and the default model is not fetched (scripts/fetch_model.sh)")
            sys.exit(1)
        print("SKIP: the default model is not fetched (scripts/fetch_model.sh)")
        return None, rest
    return args, rest


def report_failures(failures, server):
    """Ends a chaos run: the server's last log lines if anything failed, one line per failure, and
    the exit code (0 = all passed)."""
    if failures:
        sys.stderr.write("".join(server.log_lines[-80:]))
    for f in failures:
        print("FAIL:", f)
    print("PASS" if not failures else "FAILED")
    return 0 if not failures else 1


def weft_generate(weft_bin, prompt, max_tokens, model=None):
    """Greedy text of `weft generate` (the reference the server must match)."""
    cmd = [weft_bin, "generate", "--prompt", prompt, "--max-tokens", str(max_tokens), "--threads", "1"]
    if model:
        cmd += ["--model", model]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError("weft generate failed: " + out.stderr[-2000:])
    text = out.stdout
    return text[:-1] if text.endswith("\n") else text
