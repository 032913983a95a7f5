#!/usr/bin/env bash
# weft serve vs llama.cpp's server (same GGUF, same cores) on the Azure LLM conversation trace,
# time-scaled by `weft bench serve` and lengths scaled to the model: goodput (highest rate with
# >= 90 % of requests meeting both SLOs, by bisection) and throughput.
# BASELINE=llama-server (default): llama.cpp's own `llama-server` with parallel slots (continuous
#   batching), -np = weft's concurrency (workers x --max-running), the same context per sequence
#   (built by scripts/build_llama_server.sh; SLOTS=N for another -np). BASELINE=llama-cpp-python: llama-cpp-python's server,
#   one sequence at a time (the baseline of the figures before 2026-11-27).
# Writes bench/results/serve-{<baseline>,weft}-azure-<date>.json and a PNG; prints the ratios.
# Usage: bench/e2e/serve_vs_llamacpp.sh [weft binary] [requests per probe]
# RATE_MIN (0.2), RATE_MAX (5.0 req/s) and BISECT_STEPS (4): the goodput search range and resolution.
# WEFT_CONFIGS: the weft topologies to measure in the same run, space-separated, from
#   colocated (--workers <cores>, default) and disagg (--prefill 1 --decode <cores - 1>);
#   each writes serve-weft[-disagg]-azure-<date>.json and gets its own ratio line; none: the
#   baseline alone.
# Needs: scripts/setup.sh --bench (builds llama-server; installs llama-cpp-python[server]).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
weft="${1:-$root/build/release/apps/weft}"
n="${2:-16}"
model="${WEFT_MODEL:-$HOME/.cache/weft/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
trace="$root/../shared/traces/azure_llm_2023_conv.csv"
cores="$(nproc)"
day="$(date +%Y%m%d-%H%M)"
out="$root/bench/results"
mkdir -p "$out"
load_flags=(-n "$n" --trace "$trace" --trace-offset 100 --max-prompt-tokens 256 --max-output-tokens 64
            --scale-percentile 99 --goodput --rate-min "${RATE_MIN:-0.2}" --rate-max "${RATE_MAX:-5.0}" --bisect-steps "${BISECT_STEPS:-4}"
            --ttft-slo-ms 4000 --tpot-slo-ms 200 --progress-interval-s 0)
wait_http() {
  # llama-server answers /v1/models while it still loads the model (then 503 "Loading model"):
  # its /health is 200 only once it serves; llama-cpp-python has no /health.
  for _ in $(seq 240); do
    curl -sf "$1/health" > /dev/null && return 0
    curl -s -o /dev/null -w '%{http_code}' "$1/health" | grep -q 404 && curl -sf "$1/v1/models" > /dev/null && return 0
    sleep 0.5
  done
  echo "server at $1 did not come up" >&2; return 1
}
baseline="${BASELINE:-llama-server}"
ctx=1024  # per sequence: the trace is cut to 256 prompt + 64 output tokens
slots="${SLOTS:-$((cores * 32))}"  # -np; default weft's: one worker per core, --max-running 32 each
case "$baseline" in
  llama-server)
    # llama.cpp's own server with every core and one slot per sequence weft could run at once.
    server="${LLAMA_SERVER:-${WEFT_CACHE_DIR:-$HOME/.cache/weft}/llama-server-0.3.16/llama-server}"
    [ -x "$server" ] || { echo "no $server: run scripts/build_llama_server.sh" >&2; exit 2; }
    "$server" -m "$model" --port 8394 -np "$slots" -t "$cores" -c "$((slots * ctx))" --no-webui \
      > /tmp/llamacpp-bench.log 2>&1 &
    base_label=llama-server ;;
  llama-cpp-python)
    # llama-cpp-python's server: one sequence at a time.
    python3 -m llama_cpp.server --model "$model" --port 8394 --n_threads "$cores" --n_ctx 2048 \
      --interrupt_requests False > /tmp/llamacpp-bench.log 2>&1 &
    base_label=llamacpp ;;
  *) echo "BASELINE must be llama-server or llama-cpp-python" >&2; exit 2 ;;
esac
lpid=$!
wait_http http://127.0.0.1:8394
base_json="$out/serve-$base_label-azure-$day.json"
"$weft" bench serve --url http://127.0.0.1:8394 "${load_flags[@]}" --label "$base_label" \
  --out "$base_json" | tee /tmp/llamacpp-bench.summary
kill "$lpid"; wait "$lpid" || true
# weft on the same cores: colocated = one engine worker per core (continuous batching in each);
# disagg = one prefill worker, the other cores decode (DistServe), same thread count in total.
weft_files=()
for config in ${WEFT_CONFIGS:-colocated}; do
  case "$config" in
    colocated) flags=(--workers "$cores" --ctx-size "$ctx"); label=weft ;;
    disagg) flags=(--prefill 1 --decode "$((cores > 1 ? cores - 1 : 1))" --ctx-size "$ctx"); label=weft-disagg ;;
    none) continue ;;  # the baseline alone
    *) echo "unknown WEFT_CONFIGS entry '$config' (colocated, disagg, none)" >&2; exit 2 ;;
  esac
  "$weft" serve --port 8395 "${flags[@]}" > "/tmp/$label-bench-azure.out" 2> "/tmp/$label-bench-azure.err" &
  wpid=$!
  wait_http http://127.0.0.1:8395
  "$weft" bench serve --url http://127.0.0.1:8395 "${load_flags[@]}" --label "$label" \
    --out "$out/serve-$label-azure-$day.json" | tee "/tmp/$label-bench-azure.summary"
  kill "$wpid"; wait "$wpid" || true
  weft_files+=("$out/serve-$label-azure-$day.json")
done
python3 - "$base_json" "${weft_files[@]}" <<'PY'
import json, sys
l = json.load(open(sys.argv[1]))
def best(j):
    return max(r["summary"]["output_throughput_tps"] for r in j["runs"])
gl = l["goodput"]["goodput_rps"] or 0.0
for path in sys.argv[2:]:
    w = json.load(open(path))
    gw = w["goodput"]["goodput_rps"] or 0.0
    print("%s: goodput %s %.2f req/s, weft %.2f req/s -> %s" % (
        w.get("label", path), l.get("label", "baseline"), gl, gw, "%.2fx" % (gw / gl) if gl > 0 else "n/a"))
    print("%s: peak output throughput %s %.1f tok/s, weft %.1f tok/s -> %.2fx" % (
        w.get("label", path), l.get("label", "baseline"), best(l), best(w), best(w) / best(l)))
PY
python3 "$root/bench/e2e/plot_serve.py" "$base_json" "${weft_files[@]}" \
  -o "$out/serve-weft-vs-$base_label-azure-$day.png" || true
