#!/usr/bin/env bash
# Issue 41 on an H200, in one device call: the measured peaks (benchmarks/gpu_peaks.py), Hugging Face
# generate() of a random 12-layer Llama at batch 1 and 8 with shapes (tests/data/gpu_shapes/record_hf.py),
# and the proxy engine with --record-shapes, eager and with CUDA graphs plus its profiled graph captures
# (profkit trace --opt cuda_graph --base on: baseline = all switches on but cuda_graph, candidate = all on).
# Records only (--capture-only); everything lands in $OUT: gpu_shapes.tgz, peaks_h200.toml and the logs.
# PEAKS / HF name the two Python scripts where they were copied elsewhere (the device call sends a copy).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_out}; T=/tmp/g41; mkdir -p "$OUT" "$T"
PEAKS=${PEAKS:-benchmarks/gpu_peaks.py}; HF=${HF:-tests/data/gpu_shapes/record_hf.py}
{
  date -u; nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, transformers, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__)"
} 2>&1 | tee "$OUT/env.txt"
timeout 120 python3 "$PEAKS" --out "$OUT/peaks_h200.toml" > "$OUT/peaks.log" 2>&1; echo "peaks rc=$?"; cat "$OUT/peaks.log"
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader >> "$OUT/env.txt"
timeout 180 python3 "$HF" --out "$T/hf" > "$OUT/hf.log" 2>&1; echo "hf rc=$?"; tail -5 "$OUT/hf.log"
timeout 240 python3 -m profkit trace --opt cuda_graph --base on --record-shapes --capture-only --repeat 1 --isl 128 --turns 2 \
  --turn-tokens 32 --output-tokens 32 --num-steps 6 --profile-windows 1 --traces-dir "$T/proxy" --reports-dir "$T/reports" \
  --extra-server-args "--device cuda:0" > "$OUT/proxy.log" 2>&1; echo "proxy rc=$?"; tail -5 "$OUT/proxy.log"
tar czf "$OUT/gpu_shapes.tgz" -C "$T" hf proxy; ls -la "$OUT"; du -sh "$T"/hf "$T"/proxy/*
