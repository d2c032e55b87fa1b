#!/usr/bin/env bash
# device_serve.sh - the server's benchmarks on the GPU machine (issue 23): aggregate tok/s and
# time to first token at 1, 4 and 16 concurrent streams (bench/serve_load.py), full GPU and all
# experts in RAM, hotmoe serve beside a peer's llama-server (built by the caller beside the
# project, never by this script) on the same forged file.
#   bash bench/device_serve.sh HOTMOE_BIN [PEER_LLAMA_SERVER|-] [STREAMS] [TOKENS]
# STREAMS (1,4,16), TOKENS (128 per stream). Placements: full (hotmoe -ngl 99; the peer -ngl 99
# -fa on) and ram (hotmoe -ngl 99 --cpu-moe; the peer -ngl 99 -ot exps=CPU -fa on); both get -np
# set to the largest stream count and a context of that many times (TOKENS + 64).
# Output in $OUT: serve_log.txt (a line per server, placement and stream count), serve_*.json.
# Environment: MODEL (/tmp/models/q3.gguf, forged if missing), T (threads, default nproc - 1).
set -uo pipefail
[ $# -ge 1 ] || { sed -n "2,/^set -uo/p" "$0" | sed "\$d"; exit 2; }
bin=$(readlink -f "$1")
peer=${2:--}
streams=${3:-1,4,16}
tokens=${4:-128}
OUT=${OUT:-/tmp/serve_out}
mkdir -p "$OUT"
M=${MODEL:-/tmp/models/q3.gguf}
T=${T:-$(($(nproc) - 1))}
[ -f "$M" ] || "$bin" forge --preset qwen3-30b-a3b --type q4_k_m --no-hf -q -o "$M" || exit 1
np=$(echo "$streams" | tr ',' '\n' | sort -n | tail -1)
here=$(cd "$(dirname "$0")" && pwd)

wait_health() { # PORT PID: up to 300 s
  for _ in $(seq 3000); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

run() { # NAME PLACEMENT PORT CMD...: start, load, stop
  local name=$1 pl=$2 port=$3
  shift 3
  "$@" >"$OUT/serve_${name}_$pl.err" 2>&1 &
  local pid=$!
  if wait_health "$port" "$pid"; then
    python3 "$here/serve_load.py" "http://127.0.0.1:$port" --streams "$streams" --tokens "$tokens" \
      --json "$OUT/serve_${name}_$pl.json" | sed "s/^/$name $pl /" | tee -a "$OUT/serve_log.txt"
  else
    echo "$name $pl: did not start (see serve_${name}_$pl.err)" | tee -a "$OUT/serve_log.txt"
  fi
  kill -TERM "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}

ctx=$((np * (tokens + 64)))
run hotmoe full 18080 "$bin" serve -m "$M" -t "$T" -ngl 99 -np "$np" -c "$ctx" --port 18080 --queue 256
run hotmoe ram 18081 "$bin" serve -m "$M" -t "$T" -ngl 99 --cpu-moe -np "$np" -c "$ctx" --port 18081 --queue 256
if [ "$peer" != - ]; then
  run peer full 18082 "$peer" -m "$M" -t "$T" -ngl 99 -fa on -np "$np" -c "$ctx" --port 18082
  run peer ram 18083 "$peer" -m "$M" -t "$T" -ngl 99 -ot exps=CPU -fa on -np "$np" -c "$ctx" --port 18083
fi
