#!/usr/bin/env bash
# Runs on the GPU machine's host CPUs: CPU decode speed beside busy loops (other programs that
# take cores). tg32 (`bench -p 0 -n 32 -r REPS`) quiet and beside 2 and 4 busy loops, at the
# default thread count and at -t N (N: the CPUs this shell may use, 16 on the host); given a
# peer llama-bench-style binary (never built here), the peer too at -t N and -t N-loops. One
# line per case: tok/s and the goal ratio decode(loops) / (quiet x (N - loops) / N), quiet being
# the same program's figure at the same -t (the peer's -t N for its -t N-loops): the loops take
# `loops` of the N cores, and a pool that survives contention keeps >= 0.7 of the rest.
#   bash bench/device_contention.sh build/release/hotmoe /tmp/models/q3.gguf [llama-bench]
# env: REPS (3), LOOPS ("2 4"), ARGS (more `hotmoe bench` arguments, e.g. --repack), PROF=1
# (hotmoe runs with HOTMOE_POOL_PROF=1; each line adds the pool's futex sleeps: a quiet run
# should sleep only between jobs, if at all)
set -uo pipefail
[ $# -ge 2 ] || { sed -n '2,12p' "$0"; exit 2; }
bin=$1 model=$2 peer=${3:-}
n=$(nproc)
reps=${REPS:-3}
err=${OUT:-/tmp/hotmoe-out}/contention_err.txt
mkdir -p "$(dirname "$err")"
pids=()
start_loops() { for _ in $(seq "$1"); do timeout 900 sh -c 'while :; do :; done' & pids+=($!); done; }
stop_loops() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  pids=()
}
trap stop_loops EXIT
declare -A quiet
# case NAME LOOPS REF COMMAND...: COMMAND's tg32 beside LOOPS busy loops
case_line() {
  local name=$1 loops=$2 ref=$3 t
  shift 3
  start_loops "$loops"
  t=$(HOTMOE_POOL_PROF=${PROF:-0} "$@" -p 0 -n 32 -r "$reps" -o json 2>"$err" |
      grep -oE '"avg_ts": *[0-9.eE+-]+' | tail -1 | sed 's/.*: *//')
  stop_loops
  [ "$loops" = 0 ] && quiet[$ref]=$t
  awk -v name="$name" -v l="$loops" -v n="$n" -v t="${t:-0}" -v q="${quiet[$ref]:-0}" 'BEGIN {
    g = "-"; ok = ""
    if (l > 0 && q > 0 && t > 0) { r = t / (q * (n - l) / n); g = sprintf("%.2f", r); ok = r >= 0.7 ? "ok" : "LOW" }
    printf "%-26s beside %d loops: %8.2f tok/s   goal ratio %s %s\n", name, l, t, g, ok }'
  [ "${PROF:-0}" = 1 ] && grep -m1 -o 'futex sleeps.*' "$err" | sed 's/^/    /'
  return 0
}
echo "$(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')), tg32, $reps reps"
for loops in 0 ${LOOPS:-2 4}; do
  case_line "hotmoe (default -t)" "$loops" hd "$bin" bench -m "$model" ${ARGS:-}
  case_line "hotmoe -t $n" "$loops" ht "$bin" bench -m "$model" -t "$n" ${ARGS:-}
  [ -n "$peer" ] || continue
  case_line "peer -t $n" "$loops" pt "$peer" -m "$model" -t "$n"
  [ "$loops" -gt 0 ] && case_line "peer -t $((n - loops))" "$loops" pt "$peer" -m "$model" -t $((n - loops))
done
