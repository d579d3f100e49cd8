"""Issue 40's loaded check: `profkit trace --opt overlap` on the proxy beside two busy processes, N tries; records, per
try, the load average (os.getloadavg) before and after, the exit code, the expected-effect verdict, its flags (a change
outside overlap's categories), the flags withheld and why, and the profiler's slowdown per window. Stdlib only.

    python benchmarks/loaded_overlap.py OUT.json [--tries 3] [-- extra trace args]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUSY = "while True: pass"


def main() -> int:
    args = sys.argv[1:]
    extra = args[args.index("--") + 1:] if "--" in args else []
    args = args[:args.index("--")] if "--" in args else args
    out = Path(args[0])
    tries = int(args[args.index("--tries") + 1]) if "--tries" in args else 3
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2)]
    results = []
    try:
        for i in range(tries):
            with tempfile.TemporaryDirectory(prefix="loaded-overlap-") as d:
                cmd = ["profkit", "trace", "--opt", "overlap", "--traces-dir", f"{d}/traces", "--reports-dir", f"{d}/reports", *extra]
                load0 = os.getloadavg()
                t0 = time.monotonic()
                p = subprocess.run(cmd, capture_output=True, text=True)
                row: dict = {"try": i, "command": " ".join(cmd), "exit": p.returncode, "seconds": round(time.monotonic() - t0, 1),
                             "loadavg_before": [round(x, 2) for x in load0], "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
                diffs = sorted(Path(d, "reports").rglob("diff.json"))
                if diffs:
                    doc = json.loads(diffs[0].read_text())
                    ee = doc.get("expected_effect") or {}
                    row.update({"ok": ee.get("ok"), "judged": ee.get("judged"), "flags": ee.get("flags"), "against": ee.get("against"),
                                "not_judged": ee.get("not_judged"),
                                "flags_outside_own_categories": [c["category"] for c in ee.get("changes") or [] if c.get("flagged")]})
                    for side in ("baseline", "candidate"):
                        m = (doc.get("manifests") or {}).get(side) or {}
                        oh = m.get("profiler_overhead") or {}
                        row[f"slowdown_{side}"] = [round(w.get("slowdown"), 2) for w in oh.get("windows") or [oh] if w.get("slowdown")]
                    row["headline"] = (p.stdout.splitlines() or [""])[:12]
                else:
                    row["stderr_tail"] = p.stderr[-2000:]
                results.append(row)
                print(json.dumps({k: row.get(k) for k in ("try", "exit", "seconds", "loadavg_before", "ok", "flags", "not_judged")}), flush=True)
    finally:
        for b in busy:
            b.kill()
            b.wait()
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(), "tries": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
