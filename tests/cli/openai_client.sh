#!/usr/bin/env bash
# openai_client.sh - OpenAI's own Node client (tests/clients/openai: the openai package pinned by
# package-lock.json, installed with `npm ci` into the test's directory) against `hotmoe serve` on
# loopback: chat, streaming, completions, a refused request, 16 concurrent streams. Skipped (77)
# without node and npm, without libmicrohttpd, or when the npm registry cannot be reached.
#   bash tests/cli/openai_client.sh HOTMOE_BIN TMPDIR      (run from the repository root)
set -u
bin=$1
tmp=$2/openai_client_sh
mkdir -p "$tmp"
. "$(dirname "${BASH_SOURCE[0]}")/common.bash"
command -v node >/dev/null && command -v npm >/dev/null || { echo "openai_client.sh: skipped (no node/npm)"; exit 77; }

cp tests/clients/openai/package.json tests/clients/openai/package-lock.json tests/clients/openai/client.mjs "$tmp/"
if [ ! -d "$tmp/node_modules/openai" ]; then
  (cd "$tmp" && timeout 300 npm ci --no-audit --no-fund >npm.log 2>&1) ||
    { echo "openai_client.sh: skipped (npm ci failed: no registry?)"; tail -3 "$tmp/npm.log"; exit 77; }
fi
m=$tmp/q.gguf
"$bin" forge --preset tiny-qwen3moe --type q8_0 --no-hf -q -o "$m" || bad "forge"
serve_start "$bin" "$tmp/err" -m "$m" -t 2 --api-key sekret
expect "serve: listening" test -n "$port"
(cd "$tmp" && timeout 120 node client.mjs "$port") >"$tmp/client.out" 2>&1
expect "the openai client's checks (see client.out)" test $? -eq 0
grep -v '^ok' "$tmp/client.out" >&2
kill -TERM $pid 2>/dev/null
wait $pid

cli_summary openai_client.sh
