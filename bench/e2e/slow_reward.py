#!/usr/bin/env python3
"""A `weft rl --reward-cmd` program that takes its time, as a judge model or a code sandbox does:
each sample is scored after --ms-per-sample milliseconds. The score is the built-in arithmetic
verifier's: 1 when the last integer in the completion is the answer, else 0.

Protocol (docs/rl.md, "Rewards from your own program"): one JSON line per sample on stdin,
{"id", "prompt", "completion", "answer"}; one {"id", "reward"} line per sample on stdout.
Usage: weft rl ... --reward-cmd "python3 bench/e2e/slow_reward.py --ms-per-sample 50"

With --http PORT it is a `--reward-url` endpoint instead (0: any free port; the first line on
stdout says which): each POST of {"samples": [...]} is answered with {"rewards": [...]} after
--ms-per-sample milliseconds a sample, several requests at once (one thread each), as a judge
server that batches nothing would.
"""
import argparse
import http.server
import json
import re
import sys
import time


def reward(r):
    numbers = re.findall(r"-?\d+", r["completion"])
    return 1.0 if numbers and str(int(numbers[-1])) == r["answer"] else 0.0


def serve(port, ms_per_sample):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(ms_per_sample * len(body["samples"]) / 1000.0)
            out = json.dumps({"rewards": [reward(r) for r in body["samples"]]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"listening on {httpd.server_address[1]}", flush=True)
    httpd.serve_forever()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ms-per-sample", type=float, default=50.0)
    ap.add_argument("--http", type=int, default=None, metavar="PORT",
                    help="serve POSTs on 127.0.0.1:PORT (0: any) instead of JSON lines on stdin")
    a = ap.parse_args()
    if a.http is not None:
        serve(a.http, a.ms_per_sample)
        return
    for line in sys.stdin:
        r = json.loads(line)
        time.sleep(a.ms_per_sample / 1000.0)
        print(json.dumps({"id": r["id"], "reward": reward(r)}), flush=True)


if __name__ == "__main__":
    main()
