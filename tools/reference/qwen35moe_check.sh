#!/usr/bin/env bash
# qwen35moe_check.sh - the device command of the Qwen3.5-MoE check: qwen3next_check.sh's steps
# (build hotmoe for the CPU unless HOTMOE_BIN names a binary, then the Python check) for
# tools/reference/qwen35moe_check.py: tiny-qwen35moe forged in f32 with its HuggingFace twin,
# hotmoe's logits (f32 KV cache) and greedy continuations on the CPU against transformers'
# Qwen3_5MoeForCausalLM. Needs PyTorch + transformers with Qwen3_5MoeForCausalLM (the GPU
# machine; no network); without them the last line says SKIPPED and the exit status is 77.
# Results under $OUT (qwen35moe_check.json, build.log) when OUT is set. Last line:
# "qwen35moe_check: PASS", "... FAIL (...)" or "... SKIPPED (...)"; exit 0 on PASS.
#   bash tools/reference/qwen35moe_check.sh                 (from the repository root)
# Environment: as qwen3next_check.sh's (HOTMOE_BIN, CMAKE_ARGS, WORK, THREADS).
HYBRID_CHECK=qwen35moe_check HYBRID_CLASS=Qwen3_5MoeForCausalLM \
  exec bash "$(dirname "${BASH_SOURCE[0]}")/qwen3next_check.sh" "$@"
