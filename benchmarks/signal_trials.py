"""Issue 25's acceptance run: N seeded signal trials (SIGINT and SIGTERM, spread over every stage of
`profkit trace` on the proxy with two TP ranks and on the SGLang replica) with busy processes burning
the cores beside them; prints how many processes were left behind (must be 0) and whether every
interrupted manifest names the server's pid and how it ended.

    python benchmarks/signal_trials.py                 # 200 trials, seed 25, 2 busy processes, 1 trial at a time
    python benchmarks/signal_trials.py --trials 40 --workers 4 --busy 2 --json out.json

Exit status 0 only when nothing was left and every manifest check passed. The trial itself is
tests/signal_trials.py (tests/test_faults.py runs a few of the same trials).
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import signal_trials as st  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--seed", type=int, default=25)
    ap.add_argument("--workers", type=int, default=1, help="trials at a time")
    ap.add_argument("--busy", type=int, default=2, help="busy processes (`while 1: pass`) beside the trials")
    ap.add_argument("--json", type=Path, help="write every trial's outcome here")
    a = ap.parse_args()
    # Started in the background (`nohup ... &`), this process has SIGINT ignored, and so would every profkit it
    # starts: the SIGINT trials would test nothing (a first run here: profkit went on, exit 0). A user's Ctrl-C
    # reaches a profkit whose SIGINT is not ignored: so here too. SIGTERM ends the benchmark through its
    # `finally` (busy processes killed), not at once.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))

    busy = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(a.busy)]
    root = Path(tempfile.mkdtemp(prefix="profkit-signal-trials-"))
    trials = st.plan(a.seed, a.trials)
    lengths = {t: st.calibrate(t, root / f"calibrate-{t}") for t in st.TARGETS}  # with the busy processes already running
    for t, ls in lengths.items():
        print(f"{t}: stage lengths (s) " + ", ".join(f"{k} {v}" for k, v in ls.items()), flush=True)
    t0 = time.monotonic()
    done: list[st.Trial] = []
    try:
        def one(ix: int) -> st.Trial:
            t = trials[ix]
            try:
                st.run(t, root / f"t{ix:03d}", lengths[t.target])
            except AssertionError as e:  # a stage never reached: a problem of the trial, reported as such
                t.problems.append(str(e))
            finally:
                shutil.rmtree(root / f"t{ix:03d}", ignore_errors=True)
            done.append(t)
            mark = "ok" if t.ok else "FAIL"
            print(f"[{len(done):3d}/{len(trials)}] {t.target:6s} {signal.Signals(t.sig).name:7s} {t.stage:12s} +{t.delay_s:5.2f}s "
                  f"-> exit {t.returncode} landed {t.landed} left {len(t.left)} {mark} ({t.wall_s:.1f} s)"
                  + ("".join(f"\n      {x}" for x in t.problems + t.left) if not t.ok else ""), flush=True)
            return t

        with ThreadPoolExecutor(a.workers) as pool:
            list(pool.map(one, range(len(trials))))
    finally:
        for b in busy:
            b.kill()
            b.wait()
        shutil.rmtree(root, ignore_errors=True)
    wall = time.monotonic() - t0
    left = sum(len(t.left) for t in done)
    interrupted = [m for t in done for m in t.manifests if m["status"] == "interrupted"]
    named = [m for m in interrupted if isinstance(m.get("server_pid"), int) and (m.get("server_exit") or {}).get("pid") == m["server_pid"]
             and (m.get("server_exit") or {}).get("how")]
    landed = collections.Counter(f"{t.target}/{t.landed or ('finished' if t.returncode == 0 else 'between runs')}" for t in done)
    hows = collections.Counter((m.get("server_exit") or {}).get("how", "no server yet") for m in interrupted)
    print(f"\n{len(done)} trials (seed {a.seed}, {a.workers} at a time, {a.busy} busy processes) in {wall:.0f} s")
    print(f"processes left behind: {left}")
    print(f"interrupted manifests: {len(interrupted)}; naming the server pid and how it ended: {len(named)}; "
          f"interrupted before any server was spawned: {sum(1 for m in interrupted if 'server_pid' not in m)}")
    print("where the signals landed: " + ", ".join(f"{k} {v}" for k, v in sorted(landed.items())))
    print("how the servers ended: " + "; ".join(f"{k}: {v}" for k, v in hows.most_common()))
    failed = [t for t in done if not t.ok]
    print(f"trials with a problem: {len(failed)}")
    if a.json:
        a.json.write_text(json.dumps([{k: v for k, v in vars(t).items() if k != "manifests"} | {"ok": t.ok} for t in done], indent=1))
    return 0 if not failed and left == 0 and len(done) == len(trials) else 1


if __name__ == "__main__":
    sys.exit(main())
