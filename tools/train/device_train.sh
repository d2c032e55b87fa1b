#!/usr/bin/env bash
# device_train.sh - one device call of the training (GPU machine, from the repository root, the
# packed corpus carried: "carry": ["corpus/pack"]). Call it again and again, back to back (the
# machine keeps WORK only while it stays warm), until it prints "train: FINISHED":
#   bash tools/train/device_train.sh
# First call: unpacks the corpus, trains the tokenizer (~1-2 min), tokenizes, then trains; every
# call stops training ~8.5 min after it started, saving WORK/run/state.pt. Each call copies
# loss.csv, train.log (and eval.json) to $OUT; the finishing call also puts the HF folder there
# as hf.tar split in 15 MB parts (hf.tar.part-aa ...): here, `cat hf.tar.part-* | tar x`.
# Environment: WORK (default /root/hotmoe_train), BUDGET_S (default 510: seconds per call),
# TRAIN_ARGS (extra train.py arguments, e.g. "--tokens 100e6"), VOCAB (default 8192).
set -eu
t0=$(date +%s)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
W=${WORK:-/root/hotmoe_train}
out=${OUT:-$W/out}
mkdir -p "$W" "$out"
python3 -c "import torch, transformers, tokenizers, safetensors, numpy" || exit 1
for s in train heldout; do
  [ -s "$W/$s.txt" ] || xz -dc "$root/corpus/pack/$s.txt.xz" >"$W/$s.txt"
done
if [ ! -s "$W/tok/tokenizer.json" ]; then
  python3 "$root/tools/train/train_tokenizer.py" --input "$W/train.txt" --vocab "${VOCAB:-8192}" \
    --out "$W/tok" 2>&1 | tee "$W/tokenizer.log"
fi
left=$(( ${BUDGET_S:-510} - ($(date +%s) - t0) ))
# shellcheck disable=SC2086 # TRAIN_ARGS: extra words
python3 "$root/tools/train/train.py" --data "$W" --tokenizer "$W/tok" --out "$W/run" --resume \
  --max-seconds "$left" ${TRAIN_ARGS:-} 2>&1 | tail -40
cp "$W/run/loss.csv" "$W/run/train.log" "$out/" 2>/dev/null || true
cp "$W/tokenizer.log" "$out/" 2>/dev/null || true
if [ -f "$W/run/eval.json" ] && [ -d "$W/run/hf" ]; then
  cp "$W/run/eval.json" "$out/"
  tar -C "$W/run" -cf "$W/hf.tar" hf
  split -b 15000000 "$W/hf.tar" "$out/hf.tar.part-"
  ls -l "$out"
fi
echo "device_train: $(($(date +%s) - t0)) s"
