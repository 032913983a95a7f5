#!/usr/bin/env bash
# Skip-join MLFQ vs FCFS on a heavy-tailed output-length workload, same server config, same
# workload, same run. Writes bench/results/serve-<policy>-s<seed>-<date>.json per policy and seed,
# a PNG, and prints the mean/p99 E2E ratio over all seeds' requests pooled.
# Usage: bench/e2e/serve_mlfq_vs_fcfs.sh [weft binary] [rate] [requests] [prompt tokens]
# FastServe's regime is decode-bound: short prompts, heavy-tailed outputs, few batch slots, so that
# long jobs holding the slots are what short jobs wait behind (not prefill compute).
#
# Environment:
#   MAX_RUNNING      batch slots of the one worker (default 4)
#   SEEDS            workload seeds, each a separate run of every policy (default "7"); the mean
#                    of a Pareto-tailed E2E over a few hundred requests moves by 10-20 % between
#                    seeds, so pool several for a ratio worth quoting
#   WEFT_MLFQ_FLAGS  extra flags for the MLFQ server only (e.g. "--mlfq-starvation-steps 256")
#   POLICIES         what to run (default "fcfs mlfq")
#   OUTPUT_MAX       clip of the Pareto output lengths (default 512); a longer clip is a heavier
#                    tail (cv^2 5 at 512, 13 at 2000) and a larger FCFS/MLFQ gap at the same load
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
weft="${1:-$root/build/release/apps/weft}"
rate="${2:-1.5}"
n="${3:-80}"
prompt="${4:-16}"
read -r -a mlfq_extra <<< "${WEFT_MLFQ_FLAGS:-}"
read -r -a seeds <<< "${SEEDS:-7}"
read -r -a policies <<< "${POLICIES:-fcfs mlfq}"
port=8391
day="$(date +%Y%m%d-%H%M)"
out="$root/bench/results"
mkdir -p "$out"
# Small batch slots make head-of-line blocking visible, as GPU memory does in FastServe's setting.
server_flags=(--workers 1 --max-running "${MAX_RUNNING:-4}" --port "$port")
load_flags=(--url "http://127.0.0.1:$port" -n "$n" --rate "$rate" --arrival poisson
            --prompt-tokens "$prompt" --output-dist pareto --output-tokens 32 --pareto-alpha 1.2 --output-max "${OUTPUT_MAX:-512}"
            --ttft-slo-ms 5000 --tpot-slo-ms 200)
for policy in "${policies[@]}"; do
  extra=()
  [ "$policy" = mlfq ] && extra=("${mlfq_extra[@]}")
  "$weft" serve "${server_flags[@]}" --policy "$policy" "${extra[@]}" > "/tmp/weft-bench-$policy.out" 2> "/tmp/weft-bench-$policy.err" &
  pid=$!
  for _ in $(seq 120); do grep -q weft-serve-ready "/tmp/weft-bench-$policy.out" && break; sleep 0.5; done
  for seed in "${seeds[@]}"; do
    "$weft" bench serve "${load_flags[@]}" --seed "$seed" --label "$policy" \
      --out "$out/serve-$policy-s$seed-$day.json" | grep -E 'e2e_ms|throughput|errors' || true
  done
  curl -s "http://127.0.0.1:$port/metrics" > "$out/serve-$policy-$day.metrics"
  grep -E '^weft_(worker_preemptions|worker_swapped|worker_steps)' "$out/serve-$policy-$day.metrics" || true
  kill "$pid"; wait "$pid" || true
done
python3 - "$out" "$day" "${policies[@]}" <<'PY'
import glob, json, sys
out, day, policies = sys.argv[1], sys.argv[2], sys.argv[3:]
def pooled(policy):
    e2e, done, offered = [], 0.0, 0.0
    for p in sorted(glob.glob(f"{out}/serve-{policy}-s*-{day}.json")):
        run = json.load(open(p))["runs"][0]
        e2e += [r["e2e_ms"] for r in run["requests"] if r["status"] == "ok"]
        done += run["summary"]["request_throughput_rps"]
        offered += run["summary"]["offered_rate_rps"]
    e2e.sort()
    return e2e, done, offered, max(1, len(glob.glob(f"{out}/serve-{policy}-s*-{day}.json")))
stats = {}
for policy in policies:
    e2e, done, offered, n_runs = pooled(policy)
    if not e2e:
        continue
    mean = sum(e2e) / len(e2e)
    p99 = e2e[min(len(e2e) - 1, int(0.99 * len(e2e)))]
    stats[policy] = (mean, p99)
    print("%s: %d requests, E2E mean %.0f ms, p99 %.0f ms, completed %.2f of %.2f req/s offered (mean over seeds)"
          % (policy, len(e2e), mean, p99, done / n_runs, offered / n_runs))
if "fcfs" in stats and "mlfq" in stats:
    (ef, pf), (em, pm) = stats["fcfs"], stats["mlfq"]
    print("E2E mean: fcfs %.0f ms, mlfq %.0f ms -> mlfq %.2fx lower" % (ef, em, ef / em))
    print("E2E p99:  fcfs %.0f ms, mlfq %.0f ms -> mlfq %.2fx lower" % (pf, pm, pf / pm))
PY
files=()
for policy in "${policies[@]}"; do files+=("$out/serve-$policy-s${seeds[0]}-$day.json"); done
python3 "$root/bench/e2e/plot_serve.py" "${files[@]}" -o "$out/serve-mlfq-vs-fcfs-$day.png" || true
