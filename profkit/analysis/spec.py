"""Speculative cost per accepted token (DESIGN.md "Speculative cost per accepted token").

Per profile window: the mean owned GPU time of a verify iteration by phase (draft, verify,
draft_extend, other: op durations of the ops the iteration owns, unclipped, as the diff's ownership
view counts them), divided by the mean accepted length of the tokens generated in that window; and
the wall time per accepted token (wall_us / accept length, what a user sees as inter-token latency).

The accepted length comes from the server's own counts, recorded by the capture in the run manifest
per window (`profiler_overhead[.windows[i]].accept`: SGLang's and the proxy's completion_tokens /
spec_verify_ct over the requests decoding in the window, one prefill token per request left out).
A manifest recorded before that has only the unprofiled passes' accept length (`throughput[0]
.accept_length`, completion_tokens / spec_verify_ct with the prefill token in): used, and said
(`accept_source`), since it was not measured in the window.

Verify iterations: kind `verify`, the last iteration of the window left out (as the diff does: the
profiler's stop cuts it).
"""

from __future__ import annotations

import statistics

import msgspec
from typing import TYPE_CHECKING, Any, Mapping, cast

from profkit.documents import UNSET, RankSpec, SpecCost, typed_or_none

if TYPE_CHECKING:
    import polars as pl

PHASES = ("draft", "verify", "draft_extend", "other")


def rank_spec(owned: pl.DataFrame, per: pl.DataFrame) -> RankSpec | None:
    """summary.json's per-rank `speculative`: the verify iterations' mean owned GPU time by phase and
    mean wall time (None without verify iterations)."""
    import polars as pl

    its = per.filter(pl.col("kind") == "verify")
    if per.height:
        its = its.filter(pl.col("iteration") != per["iteration"].max())
    if its.height == 0 or "phase" not in owned.columns:
        return None
    ids = its["iteration"].implode()
    mine = owned.filter(pl.col("iteration").is_in(ids))
    by = mine.with_columns(pl.col("phase").fill_null("other")).group_by("phase").agg(pl.col("dur_ns").sum())
    n = its.height
    phase_us = {p: 0.0 for p in PHASES}
    for ph, ns in by.iter_rows():
        key = ph if ph in PHASES else "other"
        phase_us[key] += ns / 1000.0 / n
    return RankSpec(verify_iterations=n, owned_phase_us=dict(phase_us), owned_gpu_us=sum(phase_us.values()),
                    wall_us=float(cast(float, its["wall_ns"].mean())) / 1000.0)


def window_accept(manifest: Any, window: int | None) -> tuple[float | None, str | None]:
    """(accepted length, where it came from) of one profile window from the run manifest."""
    if not isinstance(manifest, Mapping):
        return None, None
    oh = manifest.get("profiler_overhead")
    if isinstance(oh, Mapping):
        ws = oh.get("windows")
        rec = ws[window] if isinstance(ws, list) and window is not None and 0 <= window < len(ws) else (None if isinstance(ws, list) else oh)
        acc = rec.get("accept") if isinstance(rec, Mapping) else None
        if isinstance(acc, Mapping) and isinstance(acc.get("accept_length"), (int, float)):
            return float(acc["accept_length"]), "window"
    pts = manifest.get("throughput")
    if isinstance(pts, list) and pts and isinstance(pts[0], Mapping):
        al = pts[0].get("accept_length")
        med = al.get("median") if isinstance(al, Mapping) else None
        if isinstance(med, (int, float)):
            return float(med), "unprofiled passes"
    return None, None


def spec_cost(summary: Mapping[str, Any], manifest: Any = None, window: int | None = None, rank: int = 0) -> SpecCost | None:
    """One window's speculative cost per accepted token on `rank` (None without verify iterations or
    without an accepted length). `summary`: summary.json as written, its ranks' `speculative` plain or RankSpec."""
    ranks = [r for r in summary.get("ranks") or [] if r.get("rank") == rank] or list(summary.get("ranks") or [])[:1]
    sp = typed_or_none(ranks[0].get("speculative"), RankSpec) if ranks else None
    if sp is None:
        return None
    run = got if isinstance(got := summary.get("run"), Mapping) else {}
    if manifest is None:
        manifest = summary.get("manifest") if isinstance(summary.get("manifest"), Mapping) else (
            {"profiler_overhead": run.get("profiler_overhead"), "throughput": run.get("throughput")} if run else None)
    if window is None:
        window = run.get("window") if isinstance(run.get("window"), int) else None
    acc, source = window_accept(manifest, window)
    return SpecCost(verify_iterations=sp.verify_iterations, owned_phase_us=dict(sp.owned_phase_us), wall_us=sp.wall_us,
                    accept_length=acc, accept_source=source, window=window,
                    # per accepted token: only with an accepted length (else absent)
                    phase_us_per_accepted_token={p: v / acc for p, v in sp.owned_phase_us.items()} if acc else UNSET,
                    gpu_us_per_accepted_token=sp.owned_gpu_us / acc if acc else UNSET,
                    wall_us_per_accepted_token=sp.wall_us / acc if acc else UNSET)


def side_cost(summaries: list[Mapping[str, Any]], manifest: Any = None, rank: int = 0) -> dict[str, Any] | None:
    """A side's cost over its profile windows: each window's figures, and the median over windows of
    each per-token figure (DESIGN.md "One statistic, everywhere") with its spread."""
    per = []
    for i, s in enumerate(summaries):
        run = got if isinstance(got := s.get("run"), Mapping) else {}
        w = run.get("window") if isinstance(run.get("window"), int) else (i if len(summaries) > 1 else None)
        c = spec_cost(s, manifest, w, rank)
        if c is not None:
            per.append(c)
    if not per:
        return None
    priced = [c for c in per if c.accept_length]

    def med(get: Any) -> dict[str, Any]:
        vals = [get(c) for c in priced]
        return {"median": statistics.median(vals) if vals else None, "spread": (max(vals) - min(vals)) if len(vals) > 1 else None}

    out: dict[str, Any] = {"windows": [msgspec.to_builtins(c) for c in per], "accept_source": sorted({c.accept_source for c in per if c.accept_source})}
    if priced:
        out["accept_length"] = med(lambda c: c.accept_length)
        out["phase_us_per_accepted_token"] = {p: med(lambda c, p=p: c.phase_us_per_accepted_token[p]) for p in PHASES}
        out["gpu_us_per_accepted_token"] = med(lambda c: c.gpu_us_per_accepted_token)
        out["wall_us_per_accepted_token"] = med(lambda c: c.wall_us_per_accepted_token)
    return out


def compare(base: dict[str, Any] | None, cand: dict[str, Any] | None) -> dict[str, Any] | None:
    """diff.json's `speculative`: both sides' per-token figures and the change (medians over windows)."""
    if base is None and cand is None:
        return None
    out: dict[str, Any] = {"baseline": base, "candidate": cand}
    if base and cand and base.get("gpu_us_per_accepted_token") and cand.get("gpu_us_per_accepted_token"):
        def d(get: Any) -> float | None:
            b, c = get(base), get(cand)
            return None if b is None or c is None else c - b

        out["delta"] = {
            "phase_us_per_accepted_token": {p: d(lambda s, p=p: s["phase_us_per_accepted_token"][p]["median"]) for p in PHASES},
            "gpu_us_per_accepted_token": d(lambda s: s["gpu_us_per_accepted_token"]["median"]),
            "wall_us_per_accepted_token": d(lambda s: s["wall_us_per_accepted_token"]["median"]),
            "accept_length": d(lambda s: s["accept_length"]["median"]),
        }
    return out
