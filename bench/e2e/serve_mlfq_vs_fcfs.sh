#!/usr/bin/env bash
# Skip-join MLFQ vs FCFS on a heavy-tailed output-length workload, same server config, same
# workload, same run. Writes bench/results/serve-{fcfs,mlfq}-<date>.json and a PNG, prints the
# mean/p99 E2E ratio.
# Usage: bench/e2e/serve_mlfq_vs_fcfs.sh [weft binary] [rate] [requests] [prompt tokens]
# FastServe's regime is decode-bound: short prompts, heavy-tailed outputs, few batch slots, so that
# long jobs holding the slots are what short jobs wait behind (not prefill compute).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
weft="${1:-$root/build/release/apps/weft}"
rate="${2:-1.5}"
n="${3:-80}"
prompt="${4:-16}"
# MAX_RUNNING: batch slots of the one worker (default 4).
# Extra flags for the MLFQ server only (e.g. "--mlfq-prefill-cost 0.1"), from the environment.
read -r -a mlfq_extra <<< "${WEFT_MLFQ_FLAGS:-}"
port=8391
day="$(date +%Y%m%d-%H%M)"
out="$root/bench/results"
mkdir -p "$out"
# Small batch slots make head-of-line blocking visible, as GPU memory does in FastServe's setting.
server_flags=(--workers 1 --max-running "${MAX_RUNNING:-4}" --port "$port")
load_flags=(--url "http://127.0.0.1:$port" -n "$n" --rate "$rate" --arrival poisson --seed 7
            --prompt-tokens "$prompt" --output-dist pareto --output-tokens 32 --pareto-alpha 1.2 --output-max 512
            --ttft-slo-ms 5000 --tpot-slo-ms 200)
for policy in fcfs mlfq; do
  extra=()
  [ "$policy" = mlfq ] && extra=("${mlfq_extra[@]}")
  "$weft" serve "${server_flags[@]}" --policy "$policy" "${extra[@]}" > "/tmp/weft-bench-$policy.out" 2> "/tmp/weft-bench-$policy.err" &
  pid=$!
  for _ in $(seq 120); do grep -q weft-serve-ready "/tmp/weft-bench-$policy.out" && break; sleep 0.5; done
  "$weft" bench serve "${load_flags[@]}" --label "$policy" --out "$out/serve-$policy-$day.json" | tee "/tmp/weft-bench-$policy.summary"
  curl -s "http://127.0.0.1:$port/metrics" > "$out/serve-$policy-$day.metrics"
  grep -E '^weft_(worker_preemptions|worker_swapped|worker_steps|queue_depth)' "$out/serve-$policy-$day.metrics" || true
  kill "$pid"; wait "$pid" || true
done
python3 - "$out/serve-fcfs-$day.json" "$out/serve-mlfq-$day.json" <<'PY'
import json, sys
f, m = (json.load(open(p)) for p in sys.argv[1:3])
def e2e(j):
    s = j.get("summary") or j["runs"][0]["summary"]
    return s["e2e_ms"]
ef, em = e2e(f), e2e(m)
print("E2E mean: fcfs %.0f ms, mlfq %.0f ms -> mlfq %.2fx lower" % (ef["mean"], em["mean"], ef["mean"] / em["mean"]))
print("E2E p99:  fcfs %.0f ms, mlfq %.0f ms -> mlfq %.2fx lower" % (ef["p99"], em["p99"], ef["p99"] / em["p99"]))
PY
python3 "$root/bench/e2e/plot_serve.py" "$out/serve-fcfs-$day.json" "$out/serve-mlfq-$day.json" -o "$out/serve-mlfq-vs-fcfs-$day.png" || true
