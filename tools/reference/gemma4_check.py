#!/usr/bin/env python3
"""hotmoe's CPU engine on tiny-gemma4moe against HuggingFace transformers' Gemma4ForCausalLM.

qwen3next_check.py's check (its docstring says what is compared: logits within 1e-4 x std with
an f32 KV cache, greedy 64-token continuations identical, each prompt the same bytes as its
tokens one by one) for Gemma 4's MoE model:

  1. hotmoe side (no torch): `hotmoe forge --preset tiny-gemma4moe --type f32 --seed 42 --hf DIR`
     (the GGUF as llama.cpp's converter writes gemma4: sliding and full layers by
     sliding_window_pattern, a window of 4 that every prompt outgrows, K as V on full layers,
     rope_freqs for the proportional rope, the dense MLP beside the experts, tied output,
     final_logit_softcapping; its twin as transformers reads Gemma4ForCausalLM: a flat
     gemma4_text config, the experts as gate_up_proj/down_proj, norms as stored);
  2. reference side (the GPU machine: PyTorch + transformers, no network): the twin in float64
     on the CPU (eager attention with its sliding-window mask, eager experts). SKIPPED (exit 77)
     without them.

Last line `gemma4_check: PASS`, `... FAIL (...)` or `... SKIPPED (...)`; with --out (or OUT)
also writes gemma4_check.json there. Exit status 0 on PASS, 1 on FAIL, 77 on SKIPPED.

    python3 tools/reference/gemma4_check.py --hotmoe build/release/hotmoe
    python3 tools/reference/gemma4_check.py --hotmoe-only ...   # no torch: the hotmoe side
    bash tools/reference/gemma4_check.sh      # builds hotmoe (CPU) first; the device command
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3next_check  # noqa: E402 - the check itself

if __name__ == "__main__":
    sys.exit(qwen3next_check.main("tiny-gemma4moe", "Gemma4ForCausalLM", "gemma4_check", __doc__))
