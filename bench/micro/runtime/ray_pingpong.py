#!/usr/bin/env python3
"""Baseline for weft's actor round trip: the same ping-pong written with Ray actors.

Prints one JSON object: p50/p99 round trip (us) of a 64-byte payload to an actor in another
process, and pipelined messages/s. Run by bench/micro/runtime (weft_bench_runtime) in the same run.
"""
import json
import sys
import time

try:
    import ray
except ImportError:
    print(json.dumps({"error": "ray is not installed (scripts/setup.sh --bench)"}))
    sys.exit(0)

n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)


@ray.remote
class Echo:
    def ping(self, x):
        return x


a = Echo.remote()
payload = b"x" * 64
ray.get(a.ping.remote(payload))
for _ in range(200):  # warm up
    ray.get(a.ping.remote(payload))
lat = []
for _ in range(n):
    t = time.perf_counter_ns()
    ray.get(a.ping.remote(payload))
    lat.append((time.perf_counter_ns() - t) / 1000.0)
lat.sort()
t = time.perf_counter()
ray.get([a.ping.remote(payload) for _ in range(n)])
rate = n / (time.perf_counter() - t)
print(json.dumps({"p50_us": lat[len(lat) // 2], "p99_us": lat[int(len(lat) * 0.99)],
                  "msgs_per_s": rate, "n": n, "ray": ray.__version__}))
ray.shutdown()
