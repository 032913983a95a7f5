#!/usr/bin/env bash
# Prefix caching on the Mooncake conversation trace (equal hash_ids -> equal prompt blocks), same
# run, same 2 engine workers: no cache vs local prefix caches with load-balanced routing vs local
# caches with cache-affinity routing vs the cluster segment pool (2 cache shards) with
# TTFT-estimating routing. The replay keeps whole conversations (select_conversations.py: the
# earliest multi-turn conversations, original times compressed to the rate) and scales prompts by
# 1/32 (a 512-token hash block becomes one 16-token KV block; 32-token pool segments).
# Reports TTFT p50/p99, throughput, hit rate (cached prompt tokens / prompt tokens, from usage) and,
# for the pool, the shard imbalance (max/mean segments).
# Writes bench/results/serve-cache-{none,local,affinity,pool}-<date>.json and a PNG.
# Usage: bench/e2e/serve_cache_pool.sh [weft binary] [requests] [rate] [KV blocks per worker]
# Environment: CONFIGS (default "none local affinity pool"), SEGMENT_TOKENS (pool segment, 32),
# POOL_FLAGS (extra flags for the pool run), WORKERS (engine workers, default 2),
# SELECT (spread: conversations at even intervals over
# the trace, the default; earliest: the first conversations of the trace, which all start within
# its first seconds — a burst of first turns).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
weft="${1:-$root/build/release/apps/weft}"
n="${2:-40}"
rate="${3:-0.2}"
# Device-memory-sized local caches (like a GPU's KV pool next to a big host-memory pool): 128 blocks
# of 16 tokens = 2048 tokens per worker, a few prompts' worth.
kv_blocks="${4:-128}"
trace="/tmp/weft-mooncake-conversations.jsonl"
select_flags=()
case "${SELECT:-spread}" in
  spread) select_flags=(--spread) ;;
  earliest) ;;
  *) echo "SELECT must be spread or earliest" >&2; exit 2 ;;
esac
python3 "$root/bench/e2e/select_conversations.py" "$root/../shared/traces/mooncake_conversation_trace.jsonl" \
  "$trace" --requests "$n" "${select_flags[@]}"
port=8396
day="$(date +%Y%m%d-%H%M)"
out="$root/bench/results"
mkdir -p "$out"
load_flags=(--url "http://127.0.0.1:$port" -n 0 --trace "$trace" --rate "$rate" --prompt-scale 0.03125
            --max-prompt-tokens 768 --max-output-tokens 16 --progress-interval-s 0)
run() {
  local label="$1"; shift
  "$weft" serve --port "$port" --workers "${WORKERS:-2}" --kv-blocks "$kv_blocks" "$@" > "/tmp/weft-bench-$label.out" 2> "/tmp/weft-bench-$label.err" &
  local pid=$!
  for _ in $(seq 240); do grep -q weft-serve-ready "/tmp/weft-bench-$label.out" && break; sleep 0.5; done
  "$weft" bench serve "${load_flags[@]}" --label "cache-$label" --out "$out/serve-cache-$label-$day.json" \
    | tee "/tmp/weft-bench-$label.summary"
  curl -s "http://127.0.0.1:$port/metrics" > "$out/serve-cache-$label-$day.metrics"
  kill "$pid"; wait "$pid" || true
}
configs="${CONFIGS:-none local affinity pool}"
for c in $configs; do
  case "$c" in
    none) run none --no-prefix-cache --route least-load ;;
    local) run local --route least-load ;;
    affinity) run affinity --route cache-affinity ;;
    # shellcheck disable=SC2086
    pool) run pool --cache-shards 2 --segment-tokens "${SEGMENT_TOKENS:-32}" --cache-mem-gb 0.5 \
            --route least-ttft ${POOL_FLAGS:-} ;;
    *) echo "unknown config $c" >&2; exit 2 ;;
  esac
done
python3 - "$out" "$day" "$configs" <<'PY'
import json, re, sys
out, day, configs = sys.argv[1:4]
rows = {}
for label in configs.split():
    j = json.load(open("%s/serve-cache-%s-%s.json" % (out, label, day)))
    s = (j["runs"][0] if "runs" in j else j)["summary"]
    metrics = open("%s/serve-cache-%s-%s.metrics" % (out, label, day)).read()
    def total(name, **labels):
        v = 0.0
        for line in metrics.splitlines():
            if line.startswith(name) and all('%s="%s"' % kv in line for kv in labels.items()):
                v += float(line.rsplit(" ", 1)[1])
        return v
    segs = [float(l.rsplit(" ", 1)[1]) for l in metrics.splitlines() if l.startswith("weft_cache_segments{")]
    imb = max(segs) / (sum(segs) / len(segs)) if segs and sum(segs) > 0 else float("nan")
    rows[label] = dict(ttft50=s["ttft_ms"]["p50"], ttft99=s["ttft_ms"]["p99"], tput=s["output_throughput_tps"],
                       hit=s["total_cached_tokens"] / max(1, s["total_prompt_tokens"]),
                       local=total("weft_cache_hit_tokens_total", source="local"),
                       pool=total("weft_cache_hit_tokens_total", source="pool"), imb=imb)
print("%-6s %10s %10s %9s %8s %12s %12s %9s" % ("config", "TTFT p50", "TTFT p99", "out tok/s", "hit", "local hits", "pool hits", "imbalance"))
for k, r in rows.items():
    print("%-6s %8.0fms %8.0fms %9.1f %7.1f%% %12.0f %12.0f %9.2f" % (k, r["ttft50"], r["ttft99"], r["tput"], 100 * r["hit"], r["local"], r["pool"], r["imb"]))
n, l, p, a = (rows.get(k) for k in ("none", "local", "pool", "affinity"))
if n and p:
    print("pool TTFT p50: %.2fx lower than no cache (target >= 3x)" % (n["ttft50"] / p["ttft50"]))
if l and p:
    print("pool hit rate: %.2fx local caches' with load-balanced routing (target >= 1.5x)" %
          (p["hit"] / l["hit"] if l["hit"] > 0 else float("inf")))
if a:
    print("cache-affinity hit rate: %.1f%%" % (100 * a["hit"]))
if p:
    print("shard imbalance max/mean: %.2f (target <= 1.2)" % p["imb"])
PY
files=()
for c in $configs; do files+=("$out/serve-cache-$c-$day.json"); done
python3 "$root/bench/e2e/plot_serve.py" "${files[@]}" -o "$out/serve-cache-pool-$day.png" || true
