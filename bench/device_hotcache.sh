#!/usr/bin/env bash
# device_hotcache.sh - the hot cache's tg128 curves on the GPU machine (issue 22's benchmarks):
# forged qwen3-30b-a3b q4_k_m, routing drawn from a routing profile (--moe-routing-profile:
# synthetic, said in every row), VRAM budgets emulating 8/16/24 GB cards.
#   bash bench/device_hotcache.sh HOTMOE_BIN [PEER_LLAMA_BENCH|-] [PROFILES] [BUDGETS]
# PROFILES: comma list of routing profiles (default bench/profiles/qwen3-30b-a3b-published.json;
# "none": the model's own routers, for a model no profile fits, e.g. MODEL=qwen3-next-80b-a3b);
# BUDGETS: comma list of MiB (default 8192,16384,24576). For each profile: a perf file from a
# --cpu-moe run with that routing (tg256), then for each budget:
#   nocache   part 1's automatic plan at the budget (its -ngl 99 --n-cpu-moe K, printed)
#   static    --cpu-moe + --moe-hot-cache PERF (the plan fills what the budget leaves)
#   lru, lfru the same with --moe-hot-cache-policy lru / lfru
#   updates   static + --moe-hot-cache-update-rate 0.1 --moe-hot-cache-update-interval 64
#   postfetch static + HOTMOE_POSTFETCH_FORCE=1 (cold experts' down products on the GPU)
#   prompts   pp512 and pp2048 (-b/-ub 2048) without and with the static cache (the prompt
#             routed by the model's routers, as a prompt is): the cache must not slow them
#   peer      the peer's llama-bench -ngl 99 --n-cpu-moe K-2, K, K+2 (the same VRAM as
#             hotmoe's plan at K; -fa 1 -fmoe 1 -rtr 1), its best (the 2x goal); it
#             routes by the forged model's routers (no profile), which without a cache changes
#             only which experts the CPU reads, not how many
# each `hotmoe bench ... -p 0 -n 128 -r 2 -o json` (and the peer's), its `tiered:`, `hot cache:`
# and `post-fetch:` lines (the seed's metrics) copied under its row; hotmoe's runs also write
# --moe-layer-perf-out (per-layer hit rates: hot_experts / experts). Output in $OUT:
# hotcache_log.txt (a line per run), hotcache_raw.tgz (the JSON, stderr and perf files).
# Environment: MODEL (/tmp/models/q3.gguf, forged if missing), T (threads, default nproc-1),
# DEADLINE (540 s: no run starts later), MODES (the runs after nocache: "static lru lfru updates
# postfetch prompts peer" by default), PEER_RTR (the peer's -rtr, 1; 0 where its repacked copy of the
# experts would not fit in RAM beside the file).
set -uo pipefail
[ $# -ge 1 ] || { sed -n "2,/^set -uo/p" "$0" | sed "\$d"; exit 2; }
bin=$(readlink -f "$1")
peer=${2:--}
profiles=${3:-bench/profiles/qwen3-30b-a3b-published.json}
budgets=${4:-8192,16384,24576}
OUT=${OUT:-/tmp/hotcache_out}
W=$(mktemp -d)
mkdir -p "$OUT" "$W/raw"
M=${MODEL:-/tmp/models/q3.gguf}
T=${T:-$(($(nproc) - 1))}
DEADLINE=${DEADLINE:-540}
T0=$(date +%s)
log() { echo "$*" | tee -a "$OUT/hotcache_log.txt"; }
left() { echo $((DEADLINE - ($(date +%s) - T0))); }
[ -f "$M" ] || "$bin" forge --preset qwen3-30b-a3b --type q4_k_m --no-hf -q -o "$M" || exit 1
MODES=" ${MODES:-static lru lfru updates postfetch prompts peer} "
tg() { # TAG ARGS...: one tg128 run, "tag: t/s" logged (modes not in MODES skipped)
  local tag=$1 mode=${1##*.}
  shift
  [ "$mode" = nocache ] || [ "${MODES/ ${mode%%-*} /}" != "$MODES" ] || return 0
  [ "$(left)" -gt 30 ] || { log "$tag: skipped (DEADLINE)"; return; }
  timeout -k 10 "$(left)" "$@" >"$W/raw/$tag.json" 2>"$W/raw/$tag.err"
  local ts
  ts=$(python3 -c "import json,sys; print(' / '.join('%.2f' % r['avg_ts'] for r in json.load(open(sys.argv[1]))))" "$W/raw/$tag.json" 2>/dev/null)
  log "$tag: ${ts:-failed} t/s"
  grep -E '^(hot cache|post-fetch|tiered|layer perf):' "$W/raw/$tag.err" | sed 's/^/    /' | tee -a "$OUT/hotcache_log.txt"
}
for prof in ${profiles//,/ }; do
  pn=$(basename "$prof" .json)
  rp=(--moe-routing-profile "$prof")
  [ "$prof" = none ] && rp=() pn=own-routers
  perf=$W/raw/$pn.perf.json
  timeout 200 "$bin" bench -m "$M" -t "$T" -ngl 99 --cpu-moe "${rp[@]}" -p 0 -n 256 \
    -r 1 --moe-layer-perf-out "$perf" >"$W/raw/$pn.perf_run.txt" 2>&1
  log "$pn: perf file rc $?"
  for bud in ${budgets//,/ }; do
    common=(bench -m "$M" -t "$T" -ngl 99 --vram-budget "$bud" "${rp[@]}" -p 0 -n 128 -r 2 -o json)
    tg "$pn.$bud.nocache" "$bin" "${common[@]}"
    K=$(grep -o 'plan: -ngl 99 --n-cpu-moe [0-9]*' "$W/raw/$pn.$bud.nocache.err" | grep -o '[0-9]*$')
    hc=(--cpu-moe --moe-hot-cache "$perf")
    tg "$pn.$bud.static" "$bin" "${common[@]}" "${hc[@]}" --moe-layer-perf-out "$W/raw/$pn.$bud.static.perf.json"
    tg "$pn.$bud.lru" "$bin" "${common[@]}" "${hc[@]}" --moe-hot-cache-policy lru
    tg "$pn.$bud.lfru" "$bin" "${common[@]}" "${hc[@]}" --moe-hot-cache-policy lfru
    tg "$pn.$bud.updates" "$bin" "${common[@]}" "${hc[@]}" --moe-hot-cache-update-rate 0.1 --moe-hot-cache-update-interval 64
    HOTMOE_POSTFETCH_FORCE=1 tg "$pn.$bud.postfetch" "$bin" "${common[@]}" "${hc[@]}"
    pp=(bench -m "$M" -t "$T" -ngl 99 --vram-budget "$bud" -p 512,2048 -b 2048 -ub 2048 -n 0 -r 2 -o json)
    tg "$pn.$bud.prompts-nocache" "$bin" "${pp[@]}"
    tg "$pn.$bud.prompts-static" "$bin" "${pp[@]}" "${hc[@]}"
    if [ "$peer" != - ] && [ -n "$K" ]; then
      for k in $((K > 2 ? K - 2 : 0)) "$K" $((K + 2)); do
        tg "$pn.$bud.peer-ncmoe$k" "$peer" -m "$M" -t "$T" -ngl 99 --n-cpu-moe "$k" -fa 1 -fmoe 1 -rtr "${PEER_RTR:-1}" -p 0 -n 128 -r 2 -o json
      done
    fi
  done
done
tar czf "$OUT/hotcache_raw.tgz" -C "$W" raw
log "device_hotcache: $(($(date +%s) - T0)) s"
