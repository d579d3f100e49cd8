#!/usr/bin/env bash
# Issue 30 on an H200: the same 4-switch leave-one-out sweep (topk_v2, indexer_fusion, index_share,
# overlap; CUDA graphs and overlap on, three profile windows a side) recorded K times in a row, so the
# attribution's reproducibility is measured, not assumed. Records only (--capture-only); analyzed on
# the CPU side with benchmarks/repro.py. `bash benchmarks/gpu_repro.sh start` launches the K sweeps in
# their own session and waits up to WAIT seconds; `collect` waits again; both pack each finished
# recording into $OUT/rec-<k>.tgz (graph-capture profiles trimmed with tests/data/gpu_loo/trim_capture.py).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_out}; T=/tmp/grepro; WAIT=${WAIT:-560}; K=${K:-3}; mkdir -p "$OUT" "$T"
OPTS=${OPTS:-topk_v2,indexer_fusion,index_share,overlap}
if [ "${1:-start}" = start ]; then
  nvidia-smi -L
  setsid nohup nvidia-smi --query-gpu=timestamp,clocks.sm,temperature.gpu,power.draw,utilization.gpu --format=csv -l 1 \
    > "$T/smi.csv" 2>&1 < /dev/null &
  setsid nohup bash -c "for k in \$(seq 1 $K); do python3 -m profkit sweep --opts $OPTS --mode leave-one-out \
    --capture-only --repeat 2 --isl 8000 --turns 3 --turn-tokens 256 --output-tokens 256 --num-steps 8 --profile-windows 3 \
    --traces-dir $T/rec-\$k --reports-dir $T/reports-\$k --extra-server-args '--device cuda:0' > $T/log-\$k.txt 2>&1; touch $T/DONE-\$k; done" \
    < /dev/null > /dev/null 2>&1 &
fi
t0=$(date +%s)
while [ ! -e "$T/DONE-$K" ] && [ $(( $(date +%s) - t0 )) -lt "$WAIT" ]; do sleep 5; done
for k in $(seq 1 "$K"); do
  [ -e "$T/DONE-$k" ] || { echo "recording $k not done"; tail -c 1500 "$T/log-$k.txt" 2>/dev/null; continue; }
  [ -e "$OUT/rec-$k.tgz" ] && continue
  for g in "$T"/rec-$k/*/graph_capture_profile/*.json.gz; do
    [ -e "$g" ] && python3 tests/data/gpu_loo/trim_capture.py "$g" "$g.t" && mv "$g.t" "$g"
  done
  tar czf "$OUT/rec-$k.tgz" -C "$T" "rec-$k" "log-$k.txt"
done
cp "$T/smi.csv" "$OUT/" 2>/dev/null; ls -la "$OUT"
