"""profkit's import graph (issues 15, 26): the layers of DESIGN.md ("data flows one way"), no circles, no upward arrow.

Edges are read from the source with `ast` (every import statement, lazy ones inside functions
included), so a circle that only closes at run time is found too."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

from support import ROOT

PKG = ROOT / "profkit"

# Circles allowed to remain: none (the last ones, cli <-> cli_capture/cli_report and the proxy's
# scheduler <-> tp, went with the cli/ package, whose commands import only cli/common.py, and
# proxy/rank_worker.py).
KNOWN_CIRCLES: list[set[str]] = []


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        if "__pycache__" in p.parts:
            continue
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def graph() -> dict[str, set[str]]:
    mods = _modules()
    g: dict[str, set[str]] = defaultdict(set)
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for n in ast.walk(ast.parse(p.read_text())):
            targets: list[str] = []
            if isinstance(n, ast.ImportFrom):
                if n.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - (n.level - 1)]
                    mod = ".".join(base + ([n.module] if n.module else []))
                else:
                    mod = n.module or ""
                # `from a.b import c`: the submodule a.b.c when it is one, else the module a.b
                subs = [f"{mod}.{a.name}" for a in n.names if f"{mod}.{a.name}" in mods]
                targets = subs if subs and len(subs) == len(n.names) else [mod, *subs]
            elif isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            for t in targets:
                if t in mods and t != m and not m.startswith(t + "."):  # a module using its own package's names is no circle
                    g[m].add(t)
    return g


def circles(g: dict[str, set[str]]) -> list[set[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in list(g):
        if v not in index:
            visit(v)
    return out


def test_no_new_circles():
    found = circles(graph())
    new = [c for c in found if not any(c <= k for k in KNOWN_CIRCLES)]
    assert new == [], f"import circles: {new}"


def test_analysis_and_ingest_import_nothing_above_them():  # not cli, report, capture or attribution
    g = graph()
    bad = sorted((m, t) for m, ts in g.items() if m.startswith(("profkit.analysis", "profkit.ingest"))
                 for t in ts if t.startswith(("profkit.cli", "profkit.report", "profkit.capture", "profkit.attribution")))
    assert bad == []


def test_the_cli_is_on_top():  # the library never imports the command line; only `python -m profkit` does
    g = graph()
    bad = sorted((m, t) for m, ts in g.items() if not m.startswith("profkit.cli") and m != "profkit.__main__"
                 for t in ts if t.startswith("profkit.cli"))
    assert bad == []
    commands = ("profkit.cli.analyze", "profkit.cli.capture", "profkit.cli.report")
    assert all(not (g[c] & set(commands)) for c in commands)  # each command module imports common.py, no other command


def test_the_graph_is_read():  # the test above could pass on an empty graph
    g = graph()
    assert "profkit.analysis.clock" in g["profkit.analysis.rank"] and "profkit.ingest.scan" in g["profkit.ingest.columnar"]


def _edges(g: dict[str, set[str]], src: str | tuple[str, ...], dst: str | tuple[str, ...]) -> list[tuple[str, str]]:
    src, dst = (src,) if isinstance(src, str) else src, (dst,) if isinstance(dst, str) else dst
    return sorted((m, t) for m, ts in g.items() if m.startswith(src) for t in ts if t.startswith(dst))


# Issue 26: capture stops at traces and the manifest; flows/ does the summarizing, attributing and
# rendering that follow a recording. Function-level and TYPE_CHECKING imports count (graph() reads
# every import statement): the dependency must be gone, not deferred.
def test_capture_imports_no_analysis_attribution_report_or_flows():
    assert _edges(graph(), "profkit.capture", ("profkit.analysis", "profkit.attribution", "profkit.report", "profkit.export",
                                               "profkit.flows", "profkit.findings")) == []


def test_ingest_imports_no_catalog():
    assert _edges(graph(), "profkit.ingest", "profkit.analysis.catalog") == []


def test_workloads_import_no_capture():
    assert _edges(graph(), "profkit.workloads", "profkit.capture") == []


# Issue 38: words are made in the renderers only. report/ reads summary.json and diff.json as documents (and the
# shared names of profkit.terms); it imports no analysis module, so no sentence is made below it.
def test_report_imports_no_analysis():
    assert _edges(graph(), "profkit.report", "profkit.analysis") == []


def test_the_layer_checks_can_fail():  # _edges finds the edges that exist (the checks above could pass on none)
    g = graph()
    assert _edges(g, "profkit.analysis.rank", "profkit.analysis.clock") == [("profkit.analysis.rank", "profkit.analysis.clock")]
    assert ("profkit.cli.analyze", "profkit.cli.common") in _edges(g, "profkit.cli", ("profkit.cli.common", "profkit.analysis"))


# The layers, bottom up (docs/layout.md draws them). A module may import its own package (the first
# two names: profkit.analysis.*) and any layer strictly below its own; nothing else. Packages that
# share a layer are siblings and do not import each other (capture and analysis: a recording is not
# analyzed by the capture; report and export: two outputs of the same findings).
LAYERS: dict[str, int] = {
    "profkit": 0, "profkit.errors": 0,                                              # ground: the error family
    "profkit.store": 1, "profkit.terms": 1, "profkit.apis": 1, "profkit.http": 1,   # ground: atomic writes, shared names, HTTP
    "profkit.documents": 1,                                                         # ground: summary.json and diff.json as types (issue 26)
    "profkit.ingest": 2,                                                            # trace files -> tables
    "profkit.targets": 2, "profkit.workloads": 2, "profkit.proxy": 2,               # what runs: launch specs, the driver, the engine
    "profkit.analysis": 3,                                                          # tables -> summary.json (with its cache, the catalog)
    "profkit.capture": 3,                                                           # a run -> traces/<run_id>/ (traces, manifest)
    "profkit.findings": 3,                                                          # a summary -> why the GPU is idle (data; under attribution/ once moved)
    "profkit.attribution": 4,                                                       # summaries -> diff.json, a sweep's ladder
    "profkit.report": 5, "profkit.export": 5,                                       # renderers; Perfetto and parquet exports
    "profkit.flows": 6,                                                             # each command end to end
    "profkit.cli": 7, "profkit.__main__": 8,                                        # the command line
}


def layer_of(module: str) -> tuple[str, int]:
    """The package a module belongs to (its LAYERS key: the longest that names it; "profkit" names only
    the package's own __init__) and that package's layer."""
    parts = module.split(".")
    for n in range(len(parts), 1, -1):
        key = ".".join(parts[:n])
        if key in LAYERS:
            return key, LAYERS[key]
    if module == "profkit":
        return module, LAYERS[module]
    raise KeyError(module)


def wrong_way(g: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every import that does not go down a layer: upward, or sideways into a sibling package."""
    out = []
    for m, ts in g.items():
        pm, lm = layer_of(m)
        for t in ts:
            pt, lt = layer_of(t)
            if pt != pm and lt >= lm:
                out.append((m, t))
    return sorted(out)


def test_every_module_has_a_layer():  # a new top-level module or package must be placed in LAYERS
    missing = []
    for m in _modules():
        try:
            layer_of(m)
        except KeyError:
            missing.append(m)
    assert missing == []
    with pytest.raises(KeyError):
        layer_of("profkit.unplaced")  # not the package's layer by default


def test_no_upward_arrow():
    assert wrong_way(graph()) == []


def test_an_upward_arrow_is_found():  # wrong_way is not blind: an import into a higher layer, or a sibling, is reported
    g = defaultdict(set, {m: set(ts) for m, ts in graph().items()})  # a copy: the graph itself is not touched
    assert wrong_way(g) == []
    g["profkit.ingest.cache"].add("profkit.analysis.catalog")  # the arrow issue 26 removed
    g["profkit.capture.run"].add("profkit.analysis.summarize")  # a sibling: capture does not analyze
    g["profkit.errors"].add("profkit.store")  # inside the ground, errors stays at the bottom
    assert wrong_way(g) == [("profkit.capture.run", "profkit.analysis.summarize"), ("profkit.errors", "profkit.store"),
                            ("profkit.ingest.cache", "profkit.analysis.catalog")]


# Issue 38: the command line parses and prints; flows/ does each command. cli/ imports flows/, report/
# (the renderers it prints with), documents, errors and the ground; no stage below the flows.
CLI_IMPORTS = ("profkit.flows", "profkit.report", "profkit.documents", "profkit.errors")


def cli_strays(g: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every import of a cli/ module into a package it may not use (not its own, not CLI_IMPORTS, not the ground)."""
    return sorted((m, t) for m, ts in g.items() if m.startswith("profkit.cli") for t in ts
                  if not t.startswith(("profkit.cli", *CLI_IMPORTS)) and layer_of(t)[1] > 1)


def test_the_cli_goes_through_flows():
    g = graph()
    assert cli_strays(g) == []
    used = {layer_of(t)[0] for m, ts in g.items() if m.startswith("profkit.cli") for t in ts} - {"profkit.cli"}
    assert len(used) <= 5, sorted(used)
    g = defaultdict(set, {m: set(ts) for m, ts in g.items()})  # a copy: the rule is not blind
    g["profkit.cli.analyze"].add("profkit.analysis.summarize")
    assert cli_strays(g) == [("profkit.cli.analyze", "profkit.analysis.summarize")]
