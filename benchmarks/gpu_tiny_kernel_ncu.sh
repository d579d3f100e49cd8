#!/usr/bin/env bash
# Nsight Compute's duration of each of gpu_tiny_kernel_timing's 40 kernels, launched eagerly and
# graph-replayed (benchmarks/gpu_tiny_kernel_ncu.py); clocks and caches left alone. Prints per kernel
# position the mean duration in each mode and their ratio. Writes the CSVs to $OUT.
set -eu
OUT=${OUT:-/tmp/ncu_out}; mkdir -p "$OUT"
for m in eager graph; do
  MODE=$m ncu --csv --profile-from-start off --graph-profiling node --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum python3 benchmarks/gpu_tiny_kernel_ncu.py > "$OUT/$m.csv" 2> "$OUT/$m.err" || { tail -20 "$OUT/$m.err"; exit 1; }
done
python3 - "$OUT" <<'PY'
import csv, io, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
def load(m):
    text = (out / f"{m}.csv").read_text()
    rows = list(csv.DictReader(io.StringIO(text[text.index('"ID"'):])))
    durs = [float(r["Metric Value"].replace(",", "")) for r in rows if r["Metric Name"] == "gpu__time_duration.sum"]
    unit = next(r["Metric Unit"] for r in rows if r["Metric Name"] == "gpu__time_duration.sum")
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}[unit]
    durs = [d * scale for d in durs]
    return [statistics.mean(durs[i::40]) for i in range(40)], len(durs)
e, ne = load("eager"); g, ng = load("graph")
print(f"kernels measured: eager {ne}, graph {ng}")
print(f"mean duration us: eager {statistics.mean(e):.3f}, graph {statistics.mean(g):.3f}, ratio {statistics.mean(b / a for a, b in zip(e, g)):.3f}")
print("first 8 positions eager:", [round(x, 2) for x in e[:8]])
print("first 8 positions graph:", [round(x, 2) for x in g[:8]])
PY
