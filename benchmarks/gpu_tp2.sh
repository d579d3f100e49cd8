#!/usr/bin/env bash
# On a 2-GPU machine (the device tool's nvidia-h200-x2): the proxy engine with --tp 2 over NCCL.
#  1. the GPU test of tests/test_proxy_tp.py (2 turns, 8-step profile window, NCCL kernel counts
#     equal on both ranks, SIGTERM leaves no process);
#  2. profkit's capture path with --extra-server-args "--tp 2": cuda_graph leave-one-out (NCCL
#     all-reduces inside the captured graphs vs eager), 8 profiled steps, two rank files per run;
#  3. the same eager pair with rank 1 slowed on purpose (PROFKIT_PROXY_RANK_DELAY, test-only: rank 1
#     sleeps before every all-reduce launch; eager only, a graph replay has no host code to delay).
# Records only (--capture-only: no polars/msgspec needed); analyze here with `profkit analyze DIR`.
#   bash benchmarks/gpu_tp2.sh      (writes $OUT/tp2.tgz, or $OUT/tp2.tgz.part-* above 15 MB, and
#                                    $OUT/tp2_log.txt)
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/gpu_out}; T=/tmp/gpu_tp2; rm -rf "$T"; mkdir -p "$OUT" "$T"
W="--isl 2000 --turns 2 --turn-tokens 128 --output-tokens 64 --num-steps 8 --profile-timeout 300"
{
  nvidia-smi -L
  python3 -c "import torch; print('torch', torch.__version__, 'cuda devices', torch.cuda.device_count())"
  timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_proxy_tp.py 2>&1 | tail -15
  timeout 420 python3 -m profkit trace --opt cuda_graph --base on --capture-only $W \
      --traces-dir "$T/traces" --reports-dir "$T/reports" \
      --extra-server-args "--tp 2 --device cuda:0" 2>&1 | tail -15
  PROFKIT_PROXY_RANK_DELAY=1:0.001 timeout 420 python3 -m profkit trace --opt overlap --capture-only $W \
      --traces-dir "$T/traces-delay1ms" --reports-dir "$T/reports-delay1ms" \
      --extra-server-args "--tp 2 --device cuda:0" 2>&1 | tail -15
  find "$T" -name '*.trace.json.gz' -printf '%s %p\n' | sort -k2
  # leftovers? (the servers and their ranks must be gone)
  ps -eo pid,ppid,cmd | grep -E 'profkit\.proxy\.(server|tp)' | grep -v grep || echo "no proxy processes left"
} > "$OUT/tp2_log.txt" 2>&1
tar czf "$T/tp2.tgz" -C "$T" $(cd "$T" && ls -d traces* 2>/dev/null)
if [ "$(stat -c %s "$T/tp2.tgz")" -gt 15000000 ]; then
  split -b 15m "$T/tp2.tgz" "$OUT/tp2.tgz.part-"
else
  cp "$T/tp2.tgz" "$OUT/tp2.tgz"
fi
ls -la "$OUT"; tail -60 "$OUT/tp2_log.txt"
