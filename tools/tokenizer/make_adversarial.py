#!/usr/bin/env python3
"""make_adversarial.py - writes tests/tokenizer/data/adversarial.txt: 400 short lines of
characters drawn (seeded, reproducible) from a pool chosen to stress the pre-tokenizer matchers'
backtracking: apostrophes + contraction letters in both cases, upper/lower/title/modifier/other
letters, combining marks, digits of several scripts, spaces, tabs, NBSP, \\r, slashes,
punctuation, emoji parts (ZWJ, variation selector, skin tone). NFC-normalised; no U+0085/U+FEFF.
usage: python3 tools/tokenizer/make_adversarial.py > tests/tokenizer/data/adversarial.txt"""
import random
import sys
import unicodedata

pool = (list("'''sStTmMdDrReEvVlL") + list("aZxQ") + ["ǅ", "ʰ", "ー", "中", "あ", "ß", "Σ", "σ"] +
        ["\u0301", "\u0308", "\u093f", "\u20dd"] + list("0179") + ["٣", "²", "Ⅻ", "½"] +
        [" ", " ", " ", "\t", "\u00a0", "\u3000", "\r", "\r\n", "\n"] + list("/.,!?-_()<>|") +
        ["\u200d", "\ufe0f", "\U0001f3fd", "\U0001f600", "<|im_end|>", "<|end|>", "<s>"])
rng = random.Random(20261122)
lines = []
for i in range(400):
    n = rng.randint(1, 24)
    lines.append("".join(rng.choice(pool) for _ in range(n)))
text = "\n".join(lines) + "\n"
text = unicodedata.normalize("NFC", text)
assert "\u0085" not in text and "\ufeff" not in text
sys.stdout.buffer.write(text.encode("utf-8"))
