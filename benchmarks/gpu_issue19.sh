#!/usr/bin/env bash
# Issue 19 on an H200: the proxy engine with everything on (CUDA graphs too), leave-one-out for
# topk_v2, indexer_fusion, index_share, overlap and cuda_graph (the eager-vs-graphs pair), 3 profile
# windows of 8 iterations per run, graph-capture profiles on (profkit trace/sweep set
# SGLANG_ENABLE_CUDA_GRAPH_CAPTURE_TRACE=1). Records only (--capture-only); analyzed on the CPU side.
# `bash benchmarks/gpu_issue19.sh start` launches the sweep in its own session and waits up to
# WAIT seconds; `collect` waits again; both pack what is done into $OUT (one tgz per run).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_out}; T=/tmp/g19; WAIT=${WAIT:-540}; mkdir -p "$OUT" "$T"
if [ "${1:-start}" = start ]; then
  nvidia-smi -L
  # the SM clock, temperature and power every second while the sweep runs (no throttling between runs?)
  setsid nohup nvidia-smi --query-gpu=timestamp,clocks.sm,temperature.gpu,power.draw,utilization.gpu --format=csv -l 1 \
    > "$T/smi.csv" 2>&1 < /dev/null &
  setsid nohup bash -c "python3 -m profkit sweep --opts topk_v2,indexer_fusion,index_share,overlap,cuda_graph --mode leave-one-out \
    --capture-only --repeat 2 --isl 8000 --turns 3 --turn-tokens 256 --output-tokens 256 --num-steps 8 --profile-windows 3 \
    --traces-dir $T/traces --reports-dir $T/reports --extra-server-args '--device cuda:0' > $T/log.txt 2>&1; touch $T/DONE" \
    < /dev/null > /dev/null 2>&1 &
fi
t0=$(date +%s)
while [ ! -e "$T/DONE" ] && [ $(( $(date +%s) - t0 )) -lt "$WAIT" ]; do sleep 5; done
ls "$T/traces" 2>/dev/null; tail -c 3000 "$T/log.txt"
if [ -e "$T/DONE" ]; then
  for d in "$T"/traces/*/; do n=$(basename "$d"); tar czf "$OUT/${n##*leave-one-out-}.tgz" -C "$T/traces" "$n"; done
  cp "$T/log.txt" "$T/smi.csv" "$OUT/"; ls -la "$OUT"; du -sh "$T"/traces/*/graph_capture_profile
else
  echo "NOT DONE after $WAIT s"
fi
