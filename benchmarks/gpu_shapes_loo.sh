#!/usr/bin/env bash
# Issue 41 on a GPU (run 2026-12-07 on an H100 80GB HBM3, inline in one device call): leave-one-out of topk_v2 and
# indexer_fusion with CUDA graphs on and --record-shapes (the capture profiles always carry shapes), and the topk_v2
# pair again without --record-shapes (its manifests: the overhead figure,
# benchmarks/results/record_shapes_overhead_h100_2026-12-07.txt). Records only (--capture-only). The capture
# profiles are trimmed to what profkit reads with shapes (runtime/driver calls, ranges, GPU records, cpu_ops).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_out}; T=/tmp/g41l; mkdir -p "$OUT" "$T"
r(){ s=$(date +%s); timeout 170 python3 -m profkit trace --opt $1 --base on --capture-only --repeat 2 --isl 8000 --turns 3 --turn-tokens 256 \
  --output-tokens 256 --num-steps 8 --profile-windows 2 --traces-dir $T/$2 --reports-dir $T/rep --extra-server-args "--device cuda:0" \
  ${@:3} > $OUT/$2-$1.log 2>&1; echo "$1 $2 rc=$? $(( $(date +%s)-s ))s"; tail -4 $OUT/$2-$1.log; }
r topk_v2 shapes --record-shapes
r indexer_fusion shapes --record-shapes
r topk_v2 noshapes
python3 - <<'PY'
import gzip, json, glob
KEEP = {"cuda_runtime", "cuda_driver", "user_annotation", "kernel", "gpu_memcpy", "gpu_memset", "cpu_op"}
for f in glob.glob('/tmp/g41l/shapes/*/graph_capture_profile/*.json.gz'):
    d = json.loads(gzip.open(f).read())
    d["traceEvents"] = [e for e in d["traceEvents"] if e.get("ph") == "M" or e.get("cat") in KEEP]
    with gzip.open(f, "wt", compresslevel=9) as g:
        json.dump(d, g)
PY
for d in $T/noshapes/*/; do find $d -name '*.trace.json.gz' -delete; rm -rf $d/graph_capture_profile; done
tar czf $OUT/loo_shapes.tgz -C $T shapes noshapes; ls -la $OUT
