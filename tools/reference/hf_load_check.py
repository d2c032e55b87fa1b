#!/usr/bin/env python3
"""Loads forged HuggingFace directories with transformers and runs one forward pass each.

Runs on the GPU machine (needs PyTorch + transformers). For every DIR given: the config and the
weights load with no missing, unexpected or mismatched tensors, the tokenizer loads from
tokenizer.json and round-trips a text, the chat template renders, and a forward pass gives finite
logits of the right shape. Prints one JSON object per directory and exits non-zero on any failure.

    python3 tools/reference/hf_load_check.py build/forge/tiny-qwen3moe-f32-hf ...
"""
import json
import math
import sys


def check(path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    res = {"dir": path, "ok": False}
    try:
        cfg = AutoConfig.from_pretrained(path)
        res["model_type"] = cfg.model_type
        model, info = AutoModelForCausalLM.from_pretrained(
            path, torch_dtype=torch.float32, output_loading_info=True)
        res["missing"] = list(info.get("missing_keys", []))
        res["unexpected"] = list(info.get("unexpected_keys", []))
        res["mismatched"] = [str(m) for m in info.get("mismatched_keys", [])]
        tok = AutoTokenizer.from_pretrained(path)
        text = "Hello world! The quick brown fox, 123 times. Ünïcödé ✓ 🙂"
        ids = tok.encode(text, add_special_tokens=False)
        res["n_ids"] = len(ids)
        res["roundtrip"] = tok.decode(ids) == text
        try:
            chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                           add_generation_prompt=True)
            res["chat_template"] = chat[:200]
        except Exception as e:  # noqa: BLE001 - report, don't crash
            res["chat_template_error"] = repr(e)
        with torch.no_grad():
            x = torch.tensor([ids[:16] or [0]])
            logits = model(x).logits
        res["logits_shape"] = list(logits.shape)
        res["logits_finite"] = bool(torch.isfinite(logits).all())
        res["logits_std"] = float(logits.std())
        res["vocab_size"] = cfg.vocab_size
        res["ok"] = (not res["missing"] and not res["unexpected"] and not res["mismatched"]
                     and res["logits_finite"] and logits.shape[-1] == cfg.vocab_size
                     and "chat_template_error" not in res and not math.isnan(res["logits_std"]))
    except Exception as e:  # noqa: BLE001 - one line per failure
        res["error"] = repr(e)[:2000]
    return res


def main():
    bad = 0
    for p in sys.argv[1:]:
        r = check(p)
        print(json.dumps(r), flush=True)
        bad += not r["ok"]
    print(f"{len(sys.argv) - 1 - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
