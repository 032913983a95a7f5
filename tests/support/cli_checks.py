"""Helpers of the Python tests that drive a `weft` subcommand as a user would (tests/integration/
train, tests/integration/rl): named checks that print ok/FAIL and are tallied at the end, running a
subcommand, reading a metrics file of JSON lines.

    sys.path.insert(0, <tests/support>); from cli_checks import check, finish, run_weft, read_jsonl
"""
import json
import subprocess

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
