#!/usr/bin/env bash
# make_corpus.sh - rebuilds the training corpus of the small trained qwen3moe model
# (docs/TRAINED_MODEL.md) on a fresh Debian 12 machine, as root: installs the freely licensed
# documentation/text packages listed below (and the tools that read them), then runs
# tools/train/corpus_extract.py, which extracts, normalises, deduplicates and splits the text.
#   bash tools/train/make_corpus.sh [OUTDIR]        (default: corpus/ in the repository root)
# Writes OUTDIR/train.txt, OUTDIR/heldout.txt (held-out documents, never trained on),
# OUTDIR/SOURCES.tsv (package, version, licence, bytes, ...) and OUTDIR/docs.tsv.
# Deterministic for the same package versions. About 5 minutes on 2 cores, ~1 GB of packages.
set -eu
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${1:-$root/corpus}
# Licences (from each package's /usr/share/doc/PKG/copyright; SOURCES.tsv repeats them):
#   public domain: sqlite3-doc, bible-kjv-text (KJV), dict-devil, dict-jargon, docutils-doc
#   permissive:    fortunes/fortunes-min (BSD), python3.11-doc + libpython3.11-stdlib (PSF-2.0),
#                  postgresql-doc-15 (PostgreSQL), python-django-doc (BSD-3), sphinx-doc (BSD-2),
#                  rust-doc (MIT/Apache-2.0), erlang-doc (Apache-2.0), tcl8.6-doc (BSD-like),
#                  golang-1.19-src (BSD-3), developers-reference, maint-guide (MIT option)
#   copyleft:      perl-doc (GPL-1+ or Artistic), vim-runtime (Vim), git-doc (GPL-2),
#                  debian-policy, debian-reference-en (GPL-2+),
#                  debian-handbook (GPL-2+ or CC-BY-SA-3.0), dict-gcide (GPL-2+)
pkgs="sqlite3-doc bible-kjv bible-kjv-text dict-devil dict-jargon docutils-doc fortunes-min fortunes
python3.11-doc libpython3.11-stdlib postgresql-doc-15 python-django-doc sphinx-doc rust-doc erlang-doc
tcl8.6-doc golang-1.19-src developers-reference maint-guide perl-doc vim-runtime git-doc
debian-policy debian-reference-en debian-handbook dict-gcide"
tools="python3 perl groff-base gzip xz-utils"
missing=""
for p in $pkgs $tools; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "make_corpus: installing$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  # shellcheck disable=SC2086 # a list of package names
  apt-get install -y -q --no-install-recommends $missing >/dev/null
fi
mkdir -p "$out"
t0=$(date +%s)
python3 "$root/tools/train/corpus_extract.py" "$out" ${CORPUS_ARGS:-}
echo "make_corpus: $(($(date +%s) - t0)) s"
ls -l "$out"/train.txt "$out"/heldout.txt "$out"/SOURCES.tsv
column -t -s "$(printf '\t')" "$out/SOURCES.tsv" 2>/dev/null || cat "$out/SOURCES.tsv"
