#!/usr/bin/env bash
# Issue 18 on an H200: build the CUDA TopK-V2 (nvcc, ptxas report), its exactness tests, the kernel
# benchmark (V1, torch.topk, Triton V2, CUDA V2, floor; plain and graph-replayed), then, if the tests
# passed and time is left, the proxy's leave-one-out topk_v2 run (capture only; analyzed on the CPU
# side). STAGES picks steps (default "build test bench loo"; bench runs before test; "sanitize":
# compute-sanitizer memcheck on four streamed launches; "racecheck": its shared-memory race check on
# two small streamed launches, if time is left). BENCH_ARGS: bench_kernels.py's arguments
# (default --skip-indexer; e.g. --cuda-only --cuda-variants --sizes 80K,1M). A library carried in
# $PROFKIT_KERNEL_CACHE (built elsewhere) is used when it loads, else rebuilt. Logs under $OUT.
set -u
export PYTHONUNBUFFERED=1 PROFKIT_KERNEL_CACHE=${PROFKIT_KERNEL_CACHE:-/tmp/profkit-kcache}
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"; T0=$(date +%s)
STAGES=${STAGES:-"build test bench loo"}
el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
tests_ok=1
if [[ $STAGES == *build* ]]; then
  python3 - <<'PY' 2>&1 | tee "$OUT/build.log"
import ctypes, os, time, torch
from profkit.proxy.kernels import topk_cuda as C, topk as T
lp = C.library_path()
if lp.exists():
    try:
        ctypes.CDLL(str(lp)); print("carried library loads:", lp.name)
    except OSError as e:
        print("carried library does not load, rebuilding:", e); os.remove(lp)
t = time.time(); C.build(verbose=True); print(f"built in {time.time()-t:.1f}s")
print("reason:", C.unavailable_reason(), "info:", C._info(0) if C.available() else None)
s = torch.randn(7, 81920, device="cuda"); i, sl = T.topk_v2(s, 2048, path="cuda"); torch.cuda.synchronize()
ref = torch.topk(s, 2048).indices.sort(1).values
print("smoke 80K exact:", torch.equal(ref, i.long().sort(1).values))
PY
fi
if [[ $STAGES == *bench* ]]; then
  echo "== bench at $(el)s"
  timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/bench_kernels.py --out "$OUT/bench" ${BENCH_ARGS:---skip-indexer} > "$OUT/bench.log" 2>&1
  tail -22 "$OUT/bench.log"
fi
if [[ $STAGES == *test* ]]; then
  echo "== cuda tests at $(el)s"
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider --durations=8 tests/test_kernels_topk.py -k "cuda" > "$OUT/tests_cuda.log" 2>&1
  tail -30 "$OUT/tests_cuda.log"
  grep -q " passed" "$OUT/tests_cuda.log" && ! grep -qE "failed|error" "$OUT/tests_cuda.log" || tests_ok=0
fi
if [[ $STAGES == *othertests* ]]; then
  echo "== other gpu tests at $(el)s"
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_topk.py -k "not cuda" 2>&1 | tail -8 | tee "$OUT/tests_other.log"
fi
if [[ $STAGES == *loo* ]] && [ $tests_ok = 1 ] && [ $(el) -lt ${LOO_BY:-280} ]; then
  echo "== leave-one-out topk_v2 at $(el)s"
  L=/tmp/loo; mkdir -p $L
  # (profkit/cli/common.py wraps TyperOption.display_type_rich, which the machine's older typer lacks)
  timeout $(( ${LOO_END:-570} - $(el) )) python3 -c "import sys, typer.core as tc
tc.TyperOption.display_type_rich = getattr(tc.TyperOption, 'display_type_rich', lambda self, ctx: None)
from profkit.cli import main; sys.argv = ['profkit'] + sys.argv[1:]; main()" trace --opt topk_v2 --base on --capture-only --repeat 2 --isl 8000 --turns 3 \
    --turn-tokens 256 --output-tokens 64 --num-steps 8 --profile-windows 3 --traces-dir $L/traces --reports-dir $L/reports \
    --extra-server-args "--device cuda:0" > "$OUT/loo.log" 2>&1
  tail -5 "$OUT/loo.log"; ls $L/traces
  for d in $L/traces/*/; do n=$(basename "$d"); tar czf "$OUT/loo_${n}.tgz" -C $L/traces "$n"; done; ls -la "$OUT"
fi
if [[ $STAGES == *sanitize* ]] && [ $(el) -lt ${SANITIZE_BY:-300} ]; then
  echo "== compute-sanitizer memcheck at $(el)s"
  timeout ${SANITIZE_TIMEOUT:-60} compute-sanitizer --tool memcheck --print-limit 5 python3 -c "
import torch
from profkit.proxy.kernels import topk_cuda as C
s = torch.randn(7, 1 << 20, device='cuda'); i, _ = C.topk_v2_cuda(s, 2048); torch.cuda.synchronize()
i, _ = C.topk_v2_cuda(s, 2048, flags=0); i, _ = C.topk_v2_cuda(s, 2048, stash=64); torch.cuda.synchronize()
s = torch.randn(2, 300001, device='cuda')[:, 1:]; i, _ = C.topk_v2_cuda(s, 2048, cluster=1); torch.cuda.synchronize()
print('memcheck launches done')" > "$OUT/memcheck.log" 2>&1; echo "rc=$?"
  tail -6 "$OUT/memcheck.log"
fi
if [[ $STAGES == *racecheck* ]] && [ $(el) -lt ${RACECHECK_BY:-150} ]; then
  echo "== compute-sanitizer racecheck (shared memory) at $(el)s"
  timeout ${RACECHECK_TIMEOUT:-40} compute-sanitizer --tool racecheck --print-limit 5 python3 -c "
import torch
from profkit.proxy.kernels import topk_cuda as C
s = torch.randn(2, 300001, device='cuda')[:, 1:]
for f in (3, 0):
    i, _ = C.topk_v2_cuda(s, 2048, cluster=4, flags=f); torch.cuda.synchronize()
print('racecheck launches done')" > "$OUT/racecheck.log" 2>&1; echo "rc=$?"
  tail -6 "$OUT/racecheck.log"
fi
echo "== done at $(el)s (tests_ok=$tests_ok)"
