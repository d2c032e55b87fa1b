# common.bash - sourced by the CLI tests (tests/cli/*.sh): check counters and helpers.
#   ok                       count a passed check
#   bad DESCRIPTION          count a failed check and say which
#   expect DESCRIPTION CMD…  the command succeeds
#   cli_summary [NAME]       print "N passed, N failed" and return non-zero on any failure
#   cli_skip REASON          the whole test cannot run here: print "skipped: REASON" and exit 77,
#                            which ctest reports as skipped (SKIP_RETURN_CODE in CMakeLists.txt)
#   serve_start BIN ERR ARGS… `BIN serve --port 0 ARGS…` in the background (stderr to ERR): sets
#                            pid and port once it listens (port empty when it did not); skips the
#                            test in a build without libmicrohttpd
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
expect() {
  local d=$1
  shift
  if "$@"; then ok; else bad "$d"; fi
}
cli_summary() {
  echo "${1:+$1: }$pass passed, $fail failed"
  [ "$fail" -eq 0 ]
}
cli_skip() {
  echo "skipped: $*"
  exit 77
}
serve_start() {
  local b=$1 err=$2
  shift 2
  # two malloc arenas: the resident-memory checks then see the server's own memory, not how
  # many arenas glibc made for the connection threads of one burst or another
  MALLOC_ARENA_MAX=2 "$b" serve --port 0 "$@" >/dev/null 2>"$err" &
  pid=$!
  port=
  for _ in $(seq 100); do
    port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$err" | cut -d: -f3)
    [ -n "$port" ] && return 0
    if ! kill -0 $pid 2>/dev/null; then
      grep -q "without libmicrohttpd" "$err" && cli_skip "this hotmoe has no server (libmicrohttpd)"
      return 1
    fi
    sleep 0.1
  done
  return 1
}
