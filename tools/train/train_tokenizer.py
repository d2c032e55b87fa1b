#!/usr/bin/env python3
"""train_tokenizer.py - the byte-level BPE of the small trained qwen3moe model (GPU machine, or
any machine with the `tokenizers` package; docs/TRAINED_MODEL.md).

    python3 tools/train/train_tokenizer.py --input corpus/train.txt --vocab 8192 --out OUTDIR

Trains on the train split only (documents are separated by lines "<|endoftext|>", which are
not trained on) and writes OUTDIR/tokenizer.json and OUTDIR/tokenizer_config.json in the style of
Qwen2/Qwen3: NFC normaliser, the Qwen2 Split regex (isolated) then ByteLevel (no prefix space,
no regex of its own), ByteLevel decoder, all 256 byte characters in the vocabulary; then the
three ChatML special tokens at the top ids: <|endoftext|> (vocab-3), <|im_start|> (vocab-2),
<|im_end|> (vocab-1); a ChatML chat template in tokenizer_config.json (bos none,
eos <|im_end|>, pad <|endoftext|>, as Qwen's instruct models). hotmoe reads it as
tokenizer.ggml.model = gpt2, tokenizer.ggml.pre = qwen2.
"""
import argparse
import json
import os
import sys

SEP = "<|endoftext|>"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def documents(path, max_bytes=0):
    """Yields the documents of a corpus file (split at separator lines), streaming."""
    cur, n = [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.rstrip("\n") == SEP:
                if cur:
                    yield "".join(cur)
                cur = []
                if max_bytes and n >= max_bytes:
                    return
                continue
            cur.append(line)
            n += len(line)
    if cur:
        yield "".join(cur)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", default="corpus/train.txt")
    ap.add_argument("--vocab", type=int, default=8192, help="total size, special tokens included")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-bytes", type=int, default=0, help="train on the first N bytes only")
    ap.add_argument("--min-frequency", type=int, default=2)
    args = ap.parse_args()
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers import processors, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab - len(SPECIALS), min_frequency=args.min_frequency,
        special_tokens=[], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False)
    tok.train_from_iterator(documents(args.input, args.max_bytes), trainer=trainer)
    nbpe = tok.get_vocab_size()
    tok.add_special_tokens(SPECIALS)
    ids = [tok.token_to_id(s) for s in SPECIALS]
    if ids != list(range(nbpe, nbpe + len(SPECIALS))):
        sys.exit("special token ids %s, expected after the %d BPE tokens" % (ids, nbpe))
    os.makedirs(args.out, exist_ok=True)
    tok.save(os.path.join(args.out, "tokenizer.json"))
    added = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for i, s in zip(ids, SPECIALS)}
    cfg = {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "unk_token": None, "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
        "errors": "replace", "model_max_length": 4096, "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
    }
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    sample = "The quick brown fox jumps over the lazy dog. def f(x): return x + 1\n"
    enc = tok.encode(sample)
    assert tok.decode(enc.ids) == sample, "decode(encode(s)) != s"
    print("tokenizer: %d tokens (%d BPE + %d special), %d merges; sample: %d tokens %s"
          % (tok.get_vocab_size(), nbpe, len(SPECIALS), nbpe - 256, len(enc.ids), enc.tokens[:12]))


if __name__ == "__main__":
    main()
