#!/usr/bin/env bash
# Installs the Debian 12 packages hotmoe needs to build and test (see README "Dependencies").
# Does nothing when they are present; needs root (or sudo) otherwise.
set -euo pipefail
pkgs=(gcc make cmake clang libclang-rt-14-dev python3 libjansson-dev libedit-dev libmicrohttpd-dev chromium nodejs npm wamerican)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "hotmoe: installing Debian packages: ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
