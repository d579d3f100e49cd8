#!/usr/bin/env bash
# On an H200: leave-one-out (--base on: everything on, the one optimization off for the baseline) for
# the switches whose one-at-a-time attribution is drowned by eager launch time. Records only.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_out}; T=/tmp/gpu_loo; mkdir -p "$OUT" "$T"
for o in topk_v2 moe_deferred_finalize; do
  timeout 200 python3 -m profkit trace --opt $o --base on --capture-only --repeat 3 --isl 8000 --turns 3 --turn-tokens 256 \
    --output-tokens 64 --num-steps 8 --traces-dir "$T/traces" --reports-dir "$T/reports" --extra-server-args "--device cuda:0" 2>&1 | tail -3
done > "$OUT/loo_log.txt" 2>&1
tar czf "$OUT/gpu_loo.tgz" -C "$T" traces; ls -la "$OUT"; cat "$OUT/loo_log.txt"
