#!/usr/bin/env python3
"""hotmoe's CPU engine on tiny-qwen35moe against HuggingFace transformers' Qwen3_5MoeForCausalLM.

qwen3next_check.py's check (its docstring says what is compared: logits within 1e-4 x std with
an f32 KV cache, greedy 64-token continuations identical, each prompt the same bytes as its
tokens one by one) for Qwen3.5-MoE:

  1. hotmoe side (no torch): `hotmoe forge --preset tiny-qwen35moe --type f32 --seed 42 --hf DIR`
     (the GGUF as llama.cpp's converter writes qwen35moe: ssm_beta/ssm_alpha, value heads in
     the tiled order, rope.dimension_sections, one MTP block that hotmoe does not run; its twin
     as transformers reads Qwen3_5MoeForCausalLM: a flat qwen3_5_moe_text config with
     rope_parameters' mrope_section, in_proj_qkv/z/b/a with the value heads grouped per key
     head, A_log, zero-centred norms as w - 1, experts as gate_up_proj/down_proj, no mtp.*);
  2. reference side (the GPU machine: PyTorch + transformers, no network): the twin in float64
     on the CPU (eager attention, eager experts); text positions, so transformers' interleaved
     mrope has every section at the token's position. SKIPPED (exit 77) without them.

Last line `qwen35moe_check: PASS`, `... FAIL (...)` or `... SKIPPED (...)`; with --out (or OUT)
also writes qwen35moe_check.json there. Exit status 0 on PASS, 1 on FAIL, 77 on SKIPPED.

    python3 tools/reference/qwen35moe_check.py --hotmoe build/release/hotmoe
    python3 tools/reference/qwen35moe_check.py --hotmoe-only ...   # no torch: the hotmoe side
    bash tools/reference/qwen35moe_check.sh      # builds hotmoe (CPU) first; the device command
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3next_check  # noqa: E402 - the check itself

if __name__ == "__main__":
    sys.exit(qwen3next_check.main("tiny-qwen35moe", "Qwen3_5MoeForCausalLM", "qwen35moe_check",
                                  __doc__))
