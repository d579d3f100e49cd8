#!/usr/bin/env bash
# On a GPU machine (the device tool's H200): profkit's capture path against the proxy engine on CUDA,
# one optimization at a time, plus the GPU tests of the wired Triton kernels. Records only
# (--capture-only: the GPU box lacks polars/msgspec); analyze the traces here with `profkit diff`.
#   bash benchmarks/gpu_proxy_sweep.sh        (writes $OUT/gpu_sweep.tgz.part-*, $OUT/gpu_log.txt)
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/gpu_out}; T=/tmp/gpu_sweep; mkdir -p "$OUT" "$T"
{
  nvidia-smi -L; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_proxy_switches.py tests/test_proxy_ops.py 2>&1 | tail -15
  timeout 420 python3 -m profkit sweep --opts cuda_graph,overlap,topk_v2,indexer_fusion,index_share,moe_deferred_finalize \
      --capture-only --isl 8000 --turns 3 --turn-tokens 256 --output-tokens 64 --num-steps 8 \
      --traces-dir "$T/traces" --reports-dir "$T/reports" --extra-server-args "--device cuda:0" 2>&1 | tail -30
  for m in "$T"/traces/*/manifest.json; do python3 - "$m" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); tp = (m.get("throughput") or [{}])[0]
print(m["label"], m["status"], m["stage"], "tok/s/user", (tp.get("tokens_per_s_per_user_p50") or {}).get("median"), m.get("error"))
PY
  done
} > "$OUT/gpu_log.txt" 2>&1
tar czf "$T/gpu_sweep.tgz" -C "$T" traces && split -b 15m "$T/gpu_sweep.tgz" "$OUT/gpu_sweep.tgz.part-"
ls -la "$OUT"; tail -40 "$OUT/gpu_log.txt"
