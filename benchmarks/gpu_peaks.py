"""Measured peaks of the GPU at hand, as a `--peaks FILE` TOML (issue 41; torch only, nothing of profkit).

    python3 benchmarks/gpu_peaks.py --out peaks.toml        # on the GPU machine

As /work/.library/device/METHOD.md says to measure the two ceilings: a large device-to-device copy
(bytes read plus bytes written over the time), and large matrix products on random data (never zeros)
through the framework's own library (cuBLAS here): 8192 x 8192 x 8192 in bf16, fp16, tf32 (fp32
inputs with TF32 allowed), fp32 (TF32 off) and fp8 e4m3 (torch._scaled_mm, bf16 out). Each figure is the
median of timed repeats after warm-ups, timed with CUDA events; the spread (min, max) goes beside it.
Checks each product against a float32 reference on a slice (relative error printed).
"""

from __future__ import annotations

import argparse
import datetime
import statistics

import torch


def timed(fn, reps: int, warm: int = 3) -> list[float]:
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--copy-gib", type=float, default=4.0)
    ap.add_argument("--n", type=int, default=8192)
    a = ap.parse_args()
    dev = torch.device("cuda:0")
    name = torch.cuda.get_device_name(0)
    rows: dict[str, tuple[float, float, float]] = {}

    nbytes = int(a.copy_gib * 2**30)
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    ts = timed(lambda: dst.copy_(src), reps=20)
    assert torch.equal(dst[:4096], src[:4096]) and torch.equal(dst[-4096:], src[-4096:])
    bw = [2 * nbytes / t / 1e12 for t in ts]
    rows["copy_tb_s"] = (statistics.median(bw), min(bw), max(bw))
    print(f"D2D copy {nbytes / 1e9:.2f} GB, read+written {2 * nbytes / 1e9:.2f} GB: median {statistics.median(bw):.3f} TB/s "
          f"(min {min(bw):.3f}, max {max(bw):.3f}; {len(ts)} copies)", flush=True)
    src = dst = torch.empty(0, dtype=torch.uint8, device=dev)  # frees the buffers (was `del src, dst` in the recorded run; ruff F821)
    torch.cuda.empty_cache()

    n = a.n
    flop = 2 * n**3
    g = torch.Generator(device=dev).manual_seed(0)
    x32 = torch.randn(n, n, device=dev, generator=g)
    y32 = torch.randn(n, n, device=dev, generator=g)
    ref = x32[:256].double() @ y32.double()

    def check(out: torch.Tensor, label: str) -> float:
        err = float((out[:256].double() - ref).norm() / ref.norm())
        assert err == err and err < 0.1, (label, err)
        return err

    cases = {}
    for dt, key in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        x, y = x32.to(dt), y32.to(dt)
        cases[key] = (lambda x=x, y=y: x @ y, None)
    cases["tf32"] = (lambda: x32 @ y32, True)
    cases["fp32"] = (lambda: x32 @ y32, False)
    if hasattr(torch, "float8_e4m3fn") and torch.cuda.get_device_capability(0) >= (8, 9):
        x8 = x32.to(torch.float8_e4m3fn)
        y8 = y32.t().contiguous().to(torch.float8_e4m3fn).t()  # column-major second operand, as _scaled_mm asks
        one = torch.ones((), device=dev)
        cases["fp8"] = (lambda: torch._scaled_mm(x8, y8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), None)
    for key, (fn, tf32) in cases.items():
        if tf32 is not None:
            torch.backends.cuda.matmul.allow_tf32 = tf32
        err = check(fn(), key)
        ts = timed(fn, reps=10)
        r = [flop / t / 1e12 for t in ts]
        rows[f"{key}_tflop_s"] = (statistics.median(r), min(r), max(r))
        print(f"{key:4s} {n}^3 matmul, random data: median {statistics.median(r):.1f} TFLOP/s (min {min(r):.1f}, max {max(r):.1f}; "
              f"10 after 3 warm-ups), rel. error vs float64 {err:.1e}", flush=True)
    torch.backends.cuda.matmul.allow_tf32 = False

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    lines = [f"# Measured on one {name}, {now}, torch {torch.__version__}, by benchmarks/gpu_peaks.py:",
             "# medians of CUDA-event-timed repeats (min and max in the comments); copy = bytes read + written.",
             "", "[devices.measured]", f'name = "{name}"', f'match = ["{name}"]',
             f"memory_tb_s = {rows['copy_tb_s'][0]:.3f}  # min {rows['copy_tb_s'][1]:.3f}, max {rows['copy_tb_s'][2]:.3f}",
             f'source = {{ name = "measured: {a.copy_gib:g} GiB device-to-device copy, {n}^3 matmuls on random data", date = "{now[:10]}" }}',
             "", "[devices.measured.dense_tflop_s]"]
    for k, (m, lo, hi) in rows.items():
        if k.endswith("_tflop_s"):
            lines.append(f"{k[:-8]} = {m:.1f}  # min {lo:.1f}, max {hi:.1f}")
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
