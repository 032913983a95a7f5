#!/usr/bin/env bash
# Disaggregated (--prefill 1 --decode 1) vs colocated (--workers 2) serving: same model, same number
# of worker processes and threads, same mixed workload (log-normal prompt and output lengths), same
# run. Writes bench/results/serve-{colocated,disagg}-<date>.json and a PNG; prints TTFT/TPOT
# p90/p99 and SLO attainment side by side.
# Usage: bench/e2e/serve_disagg_vs_colocated.sh [weft binary] [requests per rate] [rates...]
# GOODPUT=1: instead of fixed rates, bisect each configuration's goodput (highest rate with >= 90 %
# of requests meeting both SLOs) between RATE_MIN and RATE_MAX (default 0.1 and 1.6 req/s) in
# BISECT_STEPS (3) steps. SLOs: TTFT_SLO_MS (2000), TPOT_SLO_MS (150).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
weft="${1:-$root/build/release/apps/weft}"
n="${2:-24}"
shift 2 || true
rates=("$@")
[ "${#rates[@]}" -gt 0 ] || rates=(0.4 0.8)
port=8393
day="$(date +%Y%m%d-%H%M)"
out="$root/bench/results"
mkdir -p "$out"
if [ "${GOODPUT:-0}" = 1 ]; then
  rate_flags=(--goodput --rate-min "${RATE_MIN:-0.1}" --rate-max "${RATE_MAX:-1.6}" --bisect-steps "${BISECT_STEPS:-3}")
else
  rate_flags=(--rates "${rates[@]}")
fi
load_flags=(--url "http://127.0.0.1:$port" -n "$n" "${rate_flags[@]}" --arrival poisson --seed 11
            --prompt-dist lognormal --prompt-tokens 128 --prompt-max 384 --lognormal-sigma 0.8
            --output-dist lognormal --output-tokens 32 --output-max 96
            --ttft-slo-ms "${TTFT_SLO_MS:-2000}" --tpot-slo-ms "${TPOT_SLO_MS:-150}" --progress-interval-s 0)
run() {
  local label="$1"; shift
  "$weft" serve --port "$port" --max-running 16 "$@" > "/tmp/weft-bench-$label.out" 2> "/tmp/weft-bench-$label.err" &
  local pid=$!
  for _ in $(seq 240); do grep -q weft-serve-ready "/tmp/weft-bench-$label.out" && break; sleep 0.5; done
  "$weft" bench serve "${load_flags[@]}" --label "$label" --out "$out/serve-$label-$day.json" | tee "/tmp/weft-bench-$label.summary"
  kill "$pid"; wait "$pid" || true
}
run colocated --workers 2
run disagg --prefill 1 --decode 1
python3 - "$out/serve-colocated-$day.json" "$out/serve-disagg-$day.json" <<'PY'
import json, sys
runs = {p: json.load(open(p)) for p in sys.argv[1:3]}
def rows(j):
    return j["runs"] if "runs" in j else [j]
print("%-10s %6s %10s %10s %10s %10s %8s %9s" % ("config", "rate", "TTFT p90", "TTFT p99", "TPOT p90", "TPOT p99",
                                                "attain", "out tok/s"))
for p, j in runs.items():
    name = "colocated" if "colocated" in p else "disagg"
    for r in rows(j):
        s = r["summary"]
        print("%-10s %6.2f %8.0fms %8.0fms %8.0fms %8.0fms %7.0f%% %9.1f" % (
            name, r["rate_rps"], s["ttft_ms"]["p90"], s["ttft_ms"]["p99"], s["tpot_ms"]["p90"],
            s["tpot_ms"]["p99"], 100 * (s["slo_attainment"] or 0), s["output_throughput_tps"]))
good = {("colocated" if "colocated" in p else "disagg"): (j.get("goodput") or {}).get("goodput_rps")
        for p, j in runs.items()}
if all(v is not None for v in good.values()):
    c, d = good["colocated"], good["disagg"]
    print("goodput: colocated %.2f req/s, disaggregated %.2f req/s -> %s" % (
        c, d, "%.2fx" % (d / c) if c > 0 else "n/a"))
PY
python3 "$root/bench/e2e/plot_serve.py" "$out/serve-colocated-$day.json" "$out/serve-disagg-$day.json" -o "$out/serve-disagg-vs-colocated-$day.png" || true
