"""The runs a sweep records: its plan (each run's switch states, the run it is compared against, the
optimization it attributes), the checks of that plan, and each run's folder name. What the sweep
does with its recordings (the compared pairs, sweep.json) is profkit/flows/sweep.py's."""

from __future__ import annotations

from typing import Optional

from profkit.errors import UsageError

# (label, switch states, the label it is compared against or None, the optimization it attributes or None)
Plan = list[tuple[str, dict[str, bool], Optional[str], Optional[str]]]


def sweep_plan(target: str, opts: list[str], mode: str, base: str = "on") -> Plan:
    """(label, states, compare_against_label, attributed_opt) for every run of a sweep.

    "all" is the full configuration: with `base` "on" (default) every optimization the sweep does
    not list stays on in every run (the study's regime: CUDA graphs, overlap, ...), so the ladder
    ends at the study's own launch command and leave-one-out removes one thing from it. With
    `base` "off" the unlisted ones are off everywhere (exploration).
    """
    from profkit.targets.engines import target as target_named
    from profkit.targets.registry import registry

    names = list(registry(target_named(target)))
    rest = base == "on"
    allon = {n: (n in opts) or rest for n in names}
    none = {n: (n not in opts) and rest for n in names}
    plan: Plan = []
    if mode == "one-at-a-time":
        plan.append(("baseline", none, None, None))
        for o in opts:
            plan.append((f"+{o}", {**none, o: True}, "baseline", o))
        if len(opts) > 1:
            plan.append(("all", allon, "baseline", None))
    elif mode == "ladder":
        plan.append(("baseline", none, None, None))
        prev, cur = "baseline", dict(none)
        for o in opts:
            cur = {**cur, o: True}
            label = "+" + "+".join(x for x in opts[: opts.index(o) + 1])
            plan.append((label, dict(cur), prev, o))
            prev = label
    elif mode == "leave-one-out":
        plan.append(("all", allon, None, None))
        for o in opts:
            plan.append((f"all-{o}", {**allon, o: False}, None, o))
    else:
        raise UsageError(f"--mode {mode!r}: use one-at-a-time, ladder or leave-one-out")
    return plan


def check_sweep(target: str, plan: Plan, caps: list[str] | None) -> list[str]:
    """Refuse a sweep with a no-op comparison (registry.check_comparison); the warnings of the rest."""
    from profkit.targets.engines import target as target_named
    from profkit.targets.registry import check_comparison

    engine = target_named(target)
    runs = {label: st for label, st, _, _ in plan}
    warnings: list[str] = []
    for label, states, against, opt in plan:
        if opt is None:
            continue
        before, after = (states, runs["all"]) if against is None else (runs[against], states)
        for w in check_comparison(engine, before, after, [opt], caps):
            warnings.append(f"{label}: {w}")
    return warnings


def label_slug(label: str) -> str:
    """A sweep label as a folder-name part, its steps kept apart: "+overlap+topk_v2" ->
    "plus-overlap-plus-topk_v2", "all-topk_v2" stays, "baseline" stays."""
    import re

    first, *added = label.split("+")
    slug = "-".join(([first] if first else []) + [f"plus-{p}" for p in added if p])
    return re.sub(r"[^\w.-]+", "_", slug) or "run"
