#!/usr/bin/env bash
# gemma4_check.sh - the device command of the Gemma 4 MoE check: qwen3next_check.sh's steps
# (build hotmoe for the CPU unless HOTMOE_BIN names a binary, then the Python check) for
# tools/reference/gemma4_check.py: tiny-gemma4moe forged in f32 with its HuggingFace twin,
# hotmoe's logits (f32 KV cache) and greedy continuations on the CPU against transformers'
# Gemma4ForCausalLM. Needs PyTorch + transformers with Gemma4ForCausalLM (the GPU machine; no
# network); without them the last line says SKIPPED and the exit status is 77.
# Results under $OUT (gemma4_check.json, build.log) when OUT is set. Last line:
# "gemma4_check: PASS", "... FAIL (...)" or "... SKIPPED (...)"; exit 0 on PASS.
#   bash tools/reference/gemma4_check.sh                    (from the repository root)
# Environment: as qwen3next_check.sh's (HOTMOE_BIN, CMAKE_ARGS, WORK, THREADS).
HYBRID_CHECK=gemma4_check HYBRID_CLASS=Gemma4ForCausalLM \
  exec bash "$(dirname "${BASH_SOURCE[0]}")/qwen3next_check.sh" "$@"
