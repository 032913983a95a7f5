"""Helpers of the Python tests that drive a `weft` subcommand as a user would (tests/integration/
train, tests/integration/rl): named checks that print ok/FAIL and are tallied at the end, running a
subcommand, reading a metrics file of JSON lines.

    sys.path.insert(0, <tests/support>); from cli_checks import check, finish, run_weft, read_jsonl
"""
import json
import subprocess
import threading

FAILURES = []


def check(cond, what):
    """Records one named check; prints it as it goes."""
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def finish():
    """The exit status of the test: 1 if any check failed."""
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


def run_weft(weft, subcommand, args, timeout=300):
    """Runs `weft SUBCOMMAND ARGS...`; returns (exit status, stdout + stderr)."""
    p = subprocess.run([weft, subcommand] + list(args), capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def run_or_exit(cmd, timeout=600):
    """Runs `cmd`; on failure prints its output and exits the test. Returns stdout + stderr."""
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        print(p.stdout + p.stderr)
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}")
    return p.stdout + p.stderr


def read_jsonl(path):
    """The objects of a JSON-lines file (blank lines skipped)."""
    return [json.loads(line) for line in open(path) if line.strip()]


def run_watching(cmd, on_line, timeout=400):
    """Runs `cmd`, calling on_line(line) for every line of its output as it comes (to inject a
    fault when the run reaches a point); returns (exit status, stdout + stderr). The process is
    killed after `timeout` seconds."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = []

    def read():
        for line in p.stdout:
            out.append(line)
            on_line(line)
    t = threading.Thread(target=read, daemon=True)
    t.start()
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    t.join(timeout=10)
    return p.returncode, "".join(out)
