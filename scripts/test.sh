#!/usr/bin/env bash
# Runs every test three ways: a release build (with CUDA compiled when nvcc is present), an
# ASan+UBSan build, and a clang libFuzzer build that fuzzes the GGUF reader for a bounded time.
# Ends with one line: "tests: N passed, N failed, N skipped" (a test that exits 77, such as a GPU
# test on a machine without a CUDA device, is skipped: ctest lists it under "did not run").
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh || exit 1
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
jobs=$(nproc)
pass=0; fail=0; skip=0; broken=0
mkdir -p build

# A suite builds everything, or only $target when set; its tests' scratch files (testtmp) are
# removed once it ran, so that the three builds never hold theirs at once.
suite() { # name build-dir ctest-args -- cmake-args
  local name=$1 dir=$2; shift 2
  local cargs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do cargs+=("$1"); shift; done
  shift
  echo "== $name =="
  if ! cmake -S . -B "$dir" "$@" >"$dir.cmake.log" 2>&1 ||
     ! cmake --build "$dir" -j"$jobs" ${target:+--target "$target"} >"$dir.build.log" 2>&1; then
    echo "$name: build failed"; tail -n 40 "$dir.cmake.log" "$dir.build.log" 2>/dev/null; broken=1; return
  fi
  ctest --test-dir "$dir" --output-on-failure -j"$jobs" "${cargs[@]}" 2>&1 | tee "$dir.ctest.log"
  rm -rf "$dir/testtmp"
  local line t f s
  line=$(grep -E 'tests passed, [0-9]+ tests failed out of [0-9]+' "$dir.ctest.log" | tail -n 1)
  if [ -z "$line" ]; then echo "$name: no ctest summary"; broken=1; return; fi
  f=$(echo "$line" | sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\1/')
  t=$(echo "$line" | sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\2/')
  # ctest counts a skipped test among the passed ones; it lists each after "did not run"
  s=$(awk '/^The following tests did not run:/ { on = 1; next }
           on && /^[[:space:]]+[0-9]+ - / { if (/\(Skipped\)[[:space:]]*$/) n++; next }
           on { on = 0 }
           END { print n + 0 }' "$dir.ctest.log")
  pass=$((pass + t - f - s)); fail=$((fail + f)); skip=$((skip + s))
}

suite release build/release -- -DCMAKE_BUILD_TYPE=Release
suite sanitize build/asan -- -DCMAKE_BUILD_TYPE=Debug -DHOTMOE_SANITIZE=ON -DHOTMOE_CUDA=OFF
target=fuzzers suite fuzz build/fuzz -L fuzz -- -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang -DHOTMOE_FUZZ=ON -DHOTMOE_CUDA=OFF \
  -DHM_FUZZ_SECONDS="${HOTMOE_FUZZ_SECONDS:-60}"

[ $broken -ne 0 ] && fail=$((fail + 1))
echo "tests: $pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
