# common.bash - sourced by the CLI tests (tests/cli/*.sh): check counters and helpers.
#   ok                       count a passed check
#   bad DESCRIPTION          count a failed check and say which
#   expect DESCRIPTION CMD…  the command succeeds
#   cli_summary [NAME]       print "N passed, N failed" and return non-zero on any failure
#   cli_skip REASON          the whole test cannot run here: print "skipped: REASON" and exit 77,
#                            which ctest reports as skipped (SKIP_RETURN_CODE in CMakeLists.txt)
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
