#!/usr/bin/env bash
# device_train.sh - the training in one device call (GPU machine, from the repository root, the
# packed corpus carried: "carry": ["corpus/pack"]):
#   bash tools/train/device_train.sh
# Unpacks the corpus, trains the tokenizer (~1-2 min), tokenizes, checks the training model
# against transformers, then trains; the schedule is shortened (--fit-seconds) if the token
# budget would not end ~60 s before BUDGET_S, which leaves time to evaluate and export. Should a
# run stop early anyway, WORK/run/state.pt holds it and calling again while the machine is still
# warm carries on (--resume). Copies loss.csv, train.log, tokenizer.log (and eval.json) to $OUT;
# the finishing call also puts the HF folder there as hf.tar split in 15 MB parts
# (hf.tar.part-aa ...): here, `cat hf.tar.part-* | tar x`.
# Environment: WORK (default /root/hotmoe_train), BUDGET_S (default 560: seconds of the call),
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
left=$(( ${BUDGET_S:-560} - ($(date +%s) - t0) ))
fit=0
[ -f "$W/run/state.pt" ] || fit=$((left - 60))
# shellcheck disable=SC2086 # TRAIN_ARGS: extra words
PYTHONUNBUFFERED=1 python3 "$root/tools/train/train.py" --data "$W" --tokenizer "$W/tok" \
  --out "$W/run" --resume --max-seconds "$((left - 20))" --fit-seconds "$fit" ${TRAIN_ARGS:-} 2>&1 \
  | grep -v "^\[.*\] step [0-9]*/[0-9]* .* heldout -;" | tail -60
cp "$W/run/loss.csv" "$W/run/train.log" "$out/" 2>/dev/null || true
cp "$W/tokenizer.log" "$out/" 2>/dev/null || true
if [ -f "$W/run/eval.json" ] && [ -d "$W/run/hf" ]; then
  cp "$W/run/eval.json" "$out/"
  tar -C "$W/run" -cf "$W/hf.tar" hf
  split -b 15000000 "$W/hf.tar" "$out/hf.tar.part-"
  ls -l "$out"
fi
echo "device_train: $(($(date +%s) - t0)) s"
