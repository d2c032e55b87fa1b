#!/usr/bin/env bash
# device_deps.sh - run HERE (the dev box, which has apt and a network): fetches the Debian
# packages of the libraries the build needs that the GPU machine lacks the development files of,
# and unpacks them into build/devdeps/ (ignored by git). Today that is jansson: the GPU machine
# (Ubuntu 24.04) has libjansson.so.4 but neither jansson.h nor the libjansson.so link, and cannot
# install packages. Both are jansson 2.14 with soname libjansson.so.4, so the headers and the link
# from Debian's packages build binaries that run against the device's own library.
#
# build/ is ignored by git, so the device tool must carry the folder: run(..., carry=["build/devdeps"]).
# On the device the build is then one command (CMakeLists.txt also falls back to build/devdeps/usr
# by itself when the system has no jansson.h, so the hint is belt and braces):
#
#   cmake -S . -B build/release -DHM_DEPS_PREFIX=$PWD/build/devdeps/usr && cmake --build build/release -j16
#
# What is kept: include/jansson*.h and lib/<arch>/libjansson.so as a plain file (a copy of the
# library, not the package's symlink: links may not travel with `carry`). Its soname is
# libjansson.so.4, so that is what binaries ask for; the library itself (libjansson.so.4*) is left
# out of build/devdeps, so at run time the loader finds the device's own /usr/lib copy.
# libmicrohttpd (the server's HTTP): the GPU machine has no copy at all, so its run-time library
# (libmicrohttpd.so.12, a plain file) stays beside the link; the build's rpath finds it there. It
# needs libgnutls.so.30, which the GPU machine has.
#   bash scripts/device_deps.sh          (from anywhere; idempotent)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=build/devdeps
pkgs=(libjansson-dev libjansson4 libmicrohttpd-dev libmicrohttpd12)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp" # apt's download sandbox user must be able to write here
if ! (cd "$tmp" && apt-get download "${pkgs[@]}" >/dev/null 2>"$tmp/err"); then
  # the package lists may be missing or stale: refresh them once and retry
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  (cd "$tmp" && apt-get download "${pkgs[@]}" >/dev/null) || { cat "$tmp/err" >&2; exit 1; }
fi
rm -rf "$dest"
mkdir -p "$dest"
for deb in "$tmp"/*.deb; do
  dpkg -x "$deb" "$dest"
done
h=$dest/usr/include/jansson.h
so=$(find "$dest/usr/lib" -name 'libjansson.so' | head -1)
[ -f "$h" ] && [ -n "$so" ] && [ -e "$so" ] || { echo "device_deps: $h or libjansson.so missing after unpacking" >&2; exit 1; }
cp --remove-destination "$(readlink -f "$so")" "$so"
rm -rf "$(dirname "$so")"/libjansson.so.4* "$(dirname "$so")"/libjansson.a "$dest/usr/share"
for f in "$(dirname "$so")"/libmicrohttpd.so "$(dirname "$so")"/libmicrohttpd.so.12; do
  [ -e "$f" ] || { echo "device_deps: $f missing after unpacking" >&2; exit 1; }
  cp --remove-destination "$(readlink -f "$f")" "$f"
done
rm -f "$(dirname "$so")"/libmicrohttpd.so.12.* "$(dirname "$so")"/libmicrohttpd.a
echo "device_deps: $(ls "$tmp"/*.deb | xargs -n1 basename | tr '\n' ' ')-> $dest ($(du -sh "$dest" | cut -f1))"
