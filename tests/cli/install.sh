#!/usr/bin/env bash
# install.sh - `cmake --install BUILD --prefix P` puts a working hotmoe into P/bin.
#   bash tests/cli/install.sh HOTMOE_BIN TMPDIR      (run from the repository root)
set -u
bin=$1
tmp=$2/install_sh
rm -rf "$tmp"
mkdir -p "$tmp"
. "$(dirname "${BASH_SOURCE[0]}")/common.bash"

build=$(dirname "$(readlink -f "$bin")")
cmake --install "$build" --prefix "$tmp/inst" >"$tmp/log" 2>&1
expect "cmake --install: exit 0" test $? -eq 0
expect "installed: bin/hotmoe" test -x "$tmp/inst/bin/hotmoe"
"$tmp/inst/bin/hotmoe" --help >"$tmp/help" 2>&1
expect "the installed binary runs" grep -q "run" "$tmp/help"

cli_summary install.sh
