#!/usr/bin/env python3
"""A serving-like background load for engine measurements: every `--period` seconds wake up and
burn `--burst` seconds of CPU, for `--seconds`. Run it beside `gpu_engine_bench` to see what a
few percent of a core taken in short bursts (what a server's HTTP, CAF and client threads take
while one stream decodes) costs the engine's fork-join forward pass (docs/serving.md, "One stream
on an AMX host again (session 56)"):

    bench/micro/gpu/background_load.py --period 0.004 --burst 0.0005 --seconds 60 &
    build/release/bench/micro/gpu/gpu_engine_bench --no-llama --batches 1 --decode-steps 256
"""
import argparse
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--period", type=float, default=0.004, help="sleep between bursts, s")
    ap.add_argument("--burst", type=float, default=0.0005, help="CPU burnt per wake-up, s")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long to run, s")
    args = ap.parse_args()
    if args.period < 0 or args.burst < 0 or args.seconds <= 0:
        ap.error("--period and --burst must be >= 0, --seconds > 0")
    end = time.time() + args.seconds
    while time.time() < end:
        time.sleep(args.period)
        t = time.perf_counter()
        while time.perf_counter() - t < args.burst:
            pass


if __name__ == "__main__":
    main()
