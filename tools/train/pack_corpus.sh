#!/usr/bin/env bash
# pack_corpus.sh - shrinks the corpus made by make_corpus.sh so that it travels to the GPU
# machine with the working tree (64 MiB in all, the tracked files ~15 MB of it):
#   bash tools/train/pack_corpus.sh [CORPUS_DIR] [MAX_MB]     (defaults: corpus/, 40)
# Writes CORPUS_DIR/pack/{train.txt.xz,heldout.txt.xz,SOURCES.tsv}. If train.txt.xz would be over
# MAX_MB megabytes (10^6), the train split is cut to a prefix of whole documents (train.txt's
# documents are in a seeded random order, so a prefix is a random subset) small enough to fit;
# pack/SUBSET says how much was kept. The held-out split is always packed whole.
# Device calls name the folder in carry: "carry": ["corpus/pack"].
set -eu
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=${1:-$root/corpus}
max_mb=${2:-40}
pack=$dir/pack
mkdir -p "$pack"
rm -f "$pack"/*.xz "$pack"/SUBSET
cp "$dir/SOURCES.tsv" "$pack/"
xz -T0 -9 -c "$dir/heldout.txt" >"$pack/heldout.txt.xz"
max=$((max_mb * 1000000))
xz -T0 -9 -c "$dir/train.txt" >"$pack/train.txt.xz"
size=$(stat -c %s "$pack/train.txt.xz")
if [ "$size" -gt "$max" ]; then
  full=$(stat -c %s "$dir/train.txt")
  keep=$(python3 -c "print(int($full * $max / $size * 0.97))")
  # cut after the last document separator before byte $keep
  python3 - "$dir/train.txt" "$keep" "$pack/train.subset.txt" <<'PY'
import sys
src, keep, dst = sys.argv[1], int(sys.argv[2]), sys.argv[3]
data = open(src, "rb").read(keep)
cut = data.rfind(b"\n<|endoftext|>\n")
open(dst, "wb").write(data[:cut + len(b"\n<|endoftext|>\n")])
PY
  xz -T0 -9 -c "$pack/train.subset.txt" >"$pack/train.txt.xz"
  echo "train.txt cut to $(stat -c %s "$pack/train.subset.txt") of $full bytes" >"$pack/SUBSET"
  rm -f "$pack/train.subset.txt"
  cat "$pack/SUBSET"
fi
ls -l "$pack"
