"""Byte-identity check for refactors: every summary and diff profkit writes on the fixtures.

    python benchmarks/golden.py write /tmp/golden-before     # at the commit before a refactor
    python benchmarks/golden.py check /tmp/golden-before     # after it: exit 1 on any difference

`write` runs the real CLI (``python -m profkit``, uncached) over every trace and run folder under
tests/data and the six TraceLens steps of ../shared/public-traces (analyze --json, plus the Markdown and JSON of the diffs the fixtures pair up) and stores
what it wrote; `check` writes the same into a temporary folder and compares them byte for byte,
``profkit_version`` excepted (a refactor changes the version string, not the numbers). It imports
nothing of profkit: it is the CLI's output that must not change.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
# third-party traces are never committed: read beside the checkout (tests/data/public/README.md)
PUBLIC = Path(os.environ.get("PROFKIT_PUBLIC_TRACES") or ROOT.parent / "shared" / "public-traces")


def _analyze_inputs() -> list[Path]:
    """Single trace files and run folders (a run folder is analyzed as one run)."""
    out: list[Path] = []
    for sub in ("gpu", "gpu_proxy", "gpu_overlap"):
        out += sorted((DATA / sub).glob("*.json.gz"))
    public = sorted(PUBLIC.glob("tracelens_*_step.json.gz"))
    if not public:
        print(f"note: no third-party traces in {PUBLIC} (set PROFKIT_PUBLIC_TRACES); their summaries are left out")
    out += public
    out.append(DATA / "gpu_tp2")
    out += sorted(p / "window-0" for p in (DATA / "gpu_loo").iterdir() if (p / "window-0").is_dir())
    return [p for p in out if "graph_capture" not in p.name]


def _diff_pairs() -> list[tuple[Path, Path, str]]:
    proxy = DATA / "gpu_proxy"
    pairs = [(proxy / "baseline.trace.json.gz", proxy / f"{o}.trace.json.gz", o)
             for o in ("topk_v2", "indexer_fusion", "cuda_graph")]
    pairs.append((proxy / "loo_topk_v2_before.trace.json.gz", proxy / "loo_topk_v2_after.trace.json.gz", "topk_v2"))
    loo = DATA / "gpu_loo"
    for folder in sorted(loo.glob("all-*")):
        pairs.append((folder, loo / "all", folder.name.removeprefix("all-")))
    gpu = DATA / "gpu"
    pairs.append((gpu / "eager_decode.pt.trace.json.gz", gpu / "graph_decode.pt.trace.json.gz", ""))
    return pairs


def _name(p: Path) -> str:
    if p.parent == PUBLIC:
        return f"public__{p.name}"
    return str(p.relative_to(DATA)).replace("/", "__")


def _run(args: list[str]) -> None:
    env = dict(os.environ, COLUMNS="120", NO_COLOR="1")
    r = subprocess.run([sys.executable, "-m", "profkit", *args], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"profkit {' '.join(args)} exited {r.returncode}: {r.stderr.strip()[-400:]}")


def write(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    jobs: list[list[str]] = []
    for p in _analyze_inputs():
        jobs.append(["analyze", str(p), "--no-cache", "--json", str(out / f"{_name(p)}.summary.json")])
    for before, after, opt in _diff_pairs():
        stem = out / f"diff__{_name(before)}__{_name(after)}"
        args = ["diff", str(before), str(after), "--json", f"{stem}.json", "--md", f"{stem}.md"]
        jobs.append(args + (["--opt", opt] if opt else []))
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(_run, jobs))


def _normal(text: str, suffix: str) -> str:
    # where the public traces were read from is not an output (they were once under tests/data/public)
    text = text.replace(str(DATA / "public"), "<public>").replace(str(PUBLIC), "<public>")
    # nor is the checkout the fixtures were read from (a golden written in one worktree, checked in another)
    text = re.sub(r"[^\s\"'()\[\]<>`]*/tests/data/", "<data>/", text)
    if suffix == ".json":
        def strip(o):
            if isinstance(o, dict):
                return {k: strip(v) for k, v in o.items() if k != "profkit_version"}
            if isinstance(o, list):
                return [strip(v) for v in o]
            return o
        return json.dumps(strip(json.loads(text)), sort_keys=False)
    return re.sub(r"profkit \d+\.\d+\.\d+\S*", "profkit VERSION", text)  # the Markdown's "<sub>profkit 0.1.0 · …" line


def check(golden: Path) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        now = Path(tmp)
        write(now)
        want = {p.name for p in golden.iterdir()}
        have = {p.name for p in now.iterdir()}
        bad = sorted(want ^ have)
        for name in sorted(want & have):
            a, b = (golden / name).read_text(), (now / name).read_text()
            if a != b and _normal(a, Path(name).suffix) != _normal(b, Path(name).suffix):
                bad.append(name)
        for name in bad:
            print(f"differs: {name}")
        print(f"{len(want & have) - len([b for b in bad if b in want & have])}/{len(want)} identical")
        return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "check"):
        raise SystemExit(__doc__)
    target = Path(sys.argv[2])
    if sys.argv[1] == "write":
        write(target)
        print(f"wrote {len(list(target.iterdir()))} files to {target}")
    else:
        raise SystemExit(check(target))
