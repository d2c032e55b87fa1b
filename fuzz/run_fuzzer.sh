#!/usr/bin/env bash
# Runs a libFuzzer binary for a bounded time on a copy of the corpus. A crash input is copied
# into the regression folder (to be committed) and the test fails.
#   run_fuzzer.sh BINARY SECONDS FUZZDIR WORKDIR
set -uo pipefail
bin=$1 secs=$2 dir=$3 work=$4
mkdir -p "$work/corpus" "$work/artifacts" "$dir/regress"
cp -n "$dir"/corpus/* "$work/corpus/" 2>/dev/null
"$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$work/artifacts/" "$work/corpus" 2>"$work/log"
rc=$?
tail -n 15 "$work/log"
if [ $rc -ne 0 ]; then
  for a in "$work"/artifacts/*; do
    [ -f "$a" ] && cp "$a" "$dir/regress/" && echo "new regression input: $dir/regress/$(basename "$a")"
  done
  exit 1
fi
