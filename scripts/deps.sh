#!/usr/bin/env bash
# Installs the Debian 12 packages hotmoe needs to build and test (see README "Dependencies").
# Does nothing when they are present; needs root (or sudo) otherwise. The test-only tools
# (chromium, node and npm: the dashboard's and the real client's tests) are installed when their
# command is missing, and a failure there is a warning: those tests then report themselves
# skipped.
set -euo pipefail
pkgs=(gcc make cmake clang libclang-rt-14-dev python3 libjansson-dev libedit-dev libmicrohttpd-dev wamerican)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
optional=()
command -v chromium >/dev/null 2>&1 || optional+=(chromium)
command -v node >/dev/null 2>&1 || optional+=(nodejs)
command -v npm >/dev/null 2>&1 || optional+=(npm)
[ ${#missing[@]} -eq 0 ] && [ ${#optional[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
  echo "hotmoe: installing Debian packages: ${missing[*]}"
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [ ${#optional[@]} -gt 0 ]; then
  echo "hotmoe: installing the test-only tools: ${optional[*]}"
  $sudo apt-get install -y -qq --no-install-recommends "${optional[@]}" ||
    echo "hotmoe: could not install ${optional[*]}: the tests that need them will be skipped"
fi
