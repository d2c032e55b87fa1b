#!/usr/bin/env python3
"""wordrate.py - the share of a text's words that are English dictionary words.

The "readable English" bar of the trained model (docs/TRAINED_MODEL.md): at least 70 % of the
words a continuation generates are in Debian's wamerican list (/usr/share/dict/american-english).

DESIGN. A word is a maximal run of letters (Unicode letters), with apostrophes allowed inside
("don't", "Debian's"; a leading or trailing apostrophe is not part of the word). Runs of letters
glued to digits ("x86", "utf8", "2nd") are identifiers or numbers, not words: they are skipped,
as are numbers and punctuation. Underscores separate words (snake_case gives two). Matching is
case-insensitive; U+2019 counts as an apostrophe. A word ending in "'s" is a hit when the word
is in the dictionary (it lists many possessives) or its stem is ("Debian's" -> "Debian").
The rate is hits / words over all the input; a text without words has rate 0.

    python3 tools/train/wordrate.py [FILE ...]        (standard input without FILE)
      --dict PATH   the word list, one word a line (default /usr/share/dict/american-english)
      --min RATE    exit status 1 when the rate is below RATE
      --json        one JSON object (words, hits, rate, misses) instead of the text lines
Prints "wordrate: RATE (HITS of WORDS words in DICT)" and the misses with their counts, most
frequent first. Exit status 0, 1 (below --min), 2 (bad arguments, unreadable dictionary or file).
"""
import argparse
import collections
import json
import re
import sys

DEFAULT_DICT = "/usr/share/dict/american-english"

# an alphanumeric run with inner apostrophes; [^\W_] is a letter or a digit
_TOKEN = re.compile(r"[^\W_]+(?:'[^\W_]+)*")
_DIGIT = re.compile(r"\d")


def load_dictionary(path):
    """The lower-cased entries of a word list (one word a line, UTF-8)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return {line.strip().lower() for line in f if line.strip()}


def words_of(text):
    """The words of text in order (see DESIGN): letter runs with inner apostrophes."""
    text = text.replace("\u2019", "'")
    return [t for t in _TOKEN.findall(text) if not _DIGIT.search(t)]


def is_word(word, dic):
    w = word.lower()
    if w in dic:
        return True
    return w.endswith("'s") and w[:-2] in dic


def rate(text, dic):
    """(number of words, number in the dictionary, Counter of the misses as written)."""
    words = words_of(text)
    misses = collections.Counter(w for w in words if not is_word(w, dic))
    return len(words), len(words) - sum(misses.values()), misses


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", help="text files (default: standard input)")
    ap.add_argument("--dict", default=DEFAULT_DICT, help="word list, one word a line")
    ap.add_argument("--min", type=float, default=None, help="exit 1 when the rate is below this")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    try:
        dic = load_dictionary(a.dict)
    except OSError as e:
        print(f"wordrate: cannot read the dictionary {a.dict}: {e.strerror} "
              "(Debian: apt-get install wamerican)", file=sys.stderr)
        return 2
    if not dic:
        print(f"wordrate: the dictionary {a.dict} is empty", file=sys.stderr)
        return 2
    parts = []
    try:
        for path in a.files:
            with open(path, encoding="utf-8", errors="replace") as f:
                parts.append(f.read())
    except OSError as e:
        print(f"wordrate: cannot read {e.filename}: {e.strerror}", file=sys.stderr)
        return 2
    if not a.files:
        parts.append(sys.stdin.read())
    n, hits, misses = rate("\n".join(parts), dic)
    r = hits / n if n else 0.0
    if a.json:
        print(json.dumps({"words": n, "hits": hits, "rate": r, "dictionary": a.dict,
                          "misses": dict(misses.most_common())}, ensure_ascii=False))
    else:
        print(f"wordrate: {r:.3f} ({hits} of {n} words in {a.dict})")
        if misses:
            print("misses: " + ", ".join(w if c == 1 else f"{w} x{c}"
                                         for w, c in misses.most_common()))
    if a.min is not None and r < a.min:
        if not a.json:
            print(f"wordrate: below {a.min:g}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
