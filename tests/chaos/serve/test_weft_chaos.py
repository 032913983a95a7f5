"""`weft chaos` against `weft serve --workers 2`, as a user would run it (docs/chaos.md).

1. The product: a bounded run (load at 2 req/s for 16 s, a SIGKILL and a SIGSTOP of the busiest
   worker) must hold every invariant, exit 0, and write a well-formed report and a PNG timeline.
2. A deliberately broken build: the test binary `weft_test` with
   WEFT_TEST_DROP_TOKEN_ON_MIGRATION=1 (its router drops one token of every migrated stream). The
   same run must exit 1 with the exact-tokens invariant broken.
3. Bad options are refused with exit 2 and a message.

Usage: test_weft_chaos.py --weft PATH/TO/weft --weft-test PATH/TO/weft_test (77 = skipped: no model)
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
from weft_serve import WeftServer, parse_test_args  # noqa: E402

FAULTS = ["--fault", "kill:any@4", "--fault", "stop:any@9+2"]


def chaos(weft, url, tmp, name, extra=()):
    report, png = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".png")
    cmd = [weft, "chaos", "--url", url, "--duration", "16", "--rate", "2", "--max-tokens", "48",
           "--seed", "3", "--report", report, "--plot", png] + FAULTS + list(extra)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    print(p.stdout)
    return p, report, png


def main():
    args, _ = parse_test_args(lambda ap: ap.add_argument("--weft-test", required=True))
    if args is None:
        return 77
    failures = []

    def check(cond, what):
        print(("ok: " if cond else "FAIL: ") + what, flush=True)
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        # 1. The product holds every invariant.
        with WeftServer(args.weft, ["--workers", "2", "--max-running", "16"]) as srv:
            p, report, png = chaos(args.weft, srv.url, tmp, "good")
            if p.returncode != 0:
                sys.stderr.write(p.stderr[-3000:])
            check(p.returncode == 0, "weft chaos exits 0 against weft serve")
            rep = json.load(open(report))
            check(rep["passed"] and all(v["ok"] for v in rep["invariants"].values()),
                  "every invariant holds")
            check(rep["counts"]["lost"] == 0 and rep["counts"]["completed"] > 0, "nothing lost")
            kinds = [f["kind"] for f in rep["faults"]]
            check(kinds == ["kill", "stop"] and all(f["target"] for f in rep["faults"]),
                  "both faults fired at a worker")
            kill = rep["faults"][0]
            check(kill["detected_after_s"] is not None and kill["recovered_after_s"] is not None,
                  "the kill was detected and recovered from (%s s, %s s)"
                  % (kill["detected_after_s"], kill["recovered_after_s"]))
            check(rep["faults"][1]["recovered_after_s"] is not None, "the stopped worker resumed")
            check(len(rep["requests"]) == rep["load"]["requests"] and rep["timeline"],
                  "the report lists every request and the timeline")
            check(os.path.exists(png) and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n",
                  "the PNG timeline was written")
            # Bad options: exit 2 with a message, nothing run.
            bad = subprocess.run([args.weft, "chaos", "--url", srv.url, "--fault", "explode:any@3"],
                                 capture_output=True, text=True, timeout=60)
            check(bad.returncode == 2 and "unknown fault kind" in bad.stderr, "a bad --fault is refused")
            late = subprocess.run([args.weft, "chaos", "--url", srv.url, "--duration", "5",
                                   "--fault", "kill:any@9"], capture_output=True, text=True, timeout=60)
            check(late.returncode == 2 and "after the load ends" in late.stderr,
                  "a fault after the load is refused")

        # 2. The broken build is caught.
        with WeftServer(args.weft_test, ["--workers", "2", "--max-running", "16"],
                        env={"WEFT_TEST_DROP_TOKEN_ON_MIGRATION": "1"}) as srv:
            p, report, _ = chaos(args.weft, srv.url, tmp, "broken")
            rep = json.load(open(report))
            check(p.returncode == 1, "weft chaos exits 1 against the broken build")
            check(not rep["invariants"]["exact_tokens"]["ok"] and
                  rep["counts"]["wrong_token_count"] > 0,
                  "the dropped tokens break the exact-tokens invariant (%d requests)"
                  % rep["counts"]["wrong_token_count"])
            check("INVARIANT BROKEN" in p.stdout, "the summary says so")
    for f in failures:
        print("FAIL:", f)
    print("PASS" if not failures else "FAILED")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
