#!/usr/bin/env bash
# wordrate.sh - tools/train/wordrate.py (the dictionary-word rate of generated text) on a
# hand-made text and a hand-made word list whose counts were worked out by hand: possessives
# through their stem, contractions, case, U+2019, letters glued to digits skipped, underscores
# and hyphens splitting words, non-ASCII letters; --min's exit status, --json, several files,
# an empty text, a missing dictionary or file (exit 2). Then, where Debian's wamerican list is
# installed, a plain English sentence scores 1.0 against it. Does not use the hotmoe binary.
#   bash tests/cli/wordrate.sh HOTMOE_BIN TMPDIR      (run from the repository root)
set -u
tmp=$2/wordrate_sh
rm -rf "$tmp"
mkdir -p "$tmp"
. "$(dirname "${BASH_SOURCE[0]}")/common.bash"
command -v python3 >/dev/null || cli_skip "no python3"
wr=(python3 tools/train/wordrate.py)

printf '%s\n' the cat "don't" Debian run runs >"$tmp/dict"
# words: The cat's don't DEBIAN's runs zork cat run Dogs the cat’s café (12); skipped: 3 x86 2nd
# misses: zork Dogs café (3), so 9 hits and a rate of 0.75
printf "The cat's 3 x86 don't, DEBIAN's runs; zork_cat 'run' Dogs 2nd the-cat\xe2\x80\x99s caf\xc3\xa9\n" \
  >"$tmp/text"
out=$("${wr[@]}" --dict "$tmp/dict" --json "$tmp/text")
expect "exit 0" test $? -eq 0
expect "12 words" grep -q '"words": 12,' <<<"$out"
expect "9 hits" grep -q '"hits": 9,' <<<"$out"
expect "rate 0.75" grep -q '"rate": 0.75,' <<<"$out"
expect "misses: zork, Dogs, café" grep -q '"misses": {"zork": 1, "Dogs": 1, "café": 1}' <<<"$out"
line=$("${wr[@]}" --dict "$tmp/dict" <"$tmp/text")
expect "text line from stdin" grep -q "^wordrate: 0.750 (9 of 12 words in $tmp/dict)" <<<"$line"
expect "misses line" grep -q "^misses: zork, Dogs, café" <<<"$line"

"${wr[@]}" --dict "$tmp/dict" --min 0.75 "$tmp/text" >/dev/null
expect "--min 0.75: exit 0" test $? -eq 0
"${wr[@]}" --dict "$tmp/dict" --min 0.8 "$tmp/text" >"$tmp/out"
expect "--min 0.8: exit 1" test $? -eq 1
expect "--min 0.8: says below" grep -q "below 0.8" "$tmp/out"

# two files: counts add up; a repeated miss is counted twice
printf 'zork the\n' >"$tmp/text2"
out=$("${wr[@]}" --dict "$tmp/dict" --json "$tmp/text" "$tmp/text2")
expect "two files: 14 words, 10 hits" grep -q '"words": 14, "hits": 10,' <<<"$out"
expect "two files: zork x2" grep -q '"zork": 2' <<<"$out"

out=$(printf '42, 3.14 -- !!\n' | "${wr[@]}" --dict "$tmp/dict" --json)
expect "no words: rate 0" grep -q '"words": 0, "hits": 0, "rate": 0.0,' <<<"$out"

"${wr[@]}" --dict "$tmp/missing" "$tmp/text" >/dev/null 2>"$tmp/err"
expect "missing dictionary: exit 2" test $? -eq 2
expect "missing dictionary: named" grep -q "$tmp/missing" "$tmp/err"
"${wr[@]}" --dict "$tmp/dict" "$tmp/nofile" >/dev/null 2>"$tmp/err"
expect "missing text file: exit 2" test $? -eq 2

if [ -r /usr/share/dict/american-english ]; then
  out=$(echo "The quick brown fox jumps over the lazy dog's kennel." | "${wr[@]}" --json)
  expect "wamerican: plain English scores 1.0" grep -q '"words": 10, "hits": 10, "rate": 1.0,' <<<"$out"
else
  echo "note: /usr/share/dict/american-english missing (wamerican): its check not run"
fi
cli_summary wordrate
