"""What the user points `diff` and `report` at -> loaded documents.

A path may be a summary.json, a diff.json, a trace file (summarized now: profkit/analysis/summarize.py, with
the summary cache), or a run folder: a folder with a summary.json, a folder of trace files (one per
rank), or a folder of repeats
(``repeat-*/`` subfolders holding a summary.json or traces, or several summary files). The run
manifest comes from the summary's ``manifest`` key, else a manifest.json beside it (or one level up,
for repeats), given to each summary as a new document (with_manifest): a loaded one is never changed.
Reading only: nothing here prints or exits; bad files raise TraceInputError naming them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec

from profkit.analysis.catalog import CatalogChoice
from profkit.documents import Diff, Summary, diff_from_json, diff_of, run_of, summary_from_json, summary_of
from profkit.errors import TraceInputError
from profkit.analysis.summarize import SummarizeOptions, summarize

_TRACE_NAMES = (".trace.json", ".trace.json.gz", ".pt.trace.json", ".pt.trace.json.gz", ".gz",
                ".sqlite", ".nsys-rep", ".qdrep")  # Nsight Systems exports and reports (ingest/nsys.py)


@dataclass
class Loaded:
    """One summary as loaded: the Summary it was decoded into (once), and where its plain JSON document comes from
    when a writer asks for it (`plain`): the dict summarized now, or its file read again."""

    doc: Summary
    path: Path | None = None  # the summary.json it was read from; None: summarized now (`built`)
    built: dict[str, Any] | None = None
    manifest: Any = None  # given to it on loading (with_manifest)

    def plain(self) -> dict[str, Any]:
        d = self.built if self.built is not None or self.path is None else check_summary(read_json(self.path), self.path)
        return with_manifest(d or {}, self.manifest)


def _loaded(doc: Summary | dict[str, Any], path: Path | None) -> Loaded:
    return Loaded(doc, path) if isinstance(doc, Summary) else Loaded(summary_of(doc), None, doc)


def _given(x: Loaded, manifest: Any) -> Loaded:
    """with_manifest on a loaded summary: a new Loaded, the loaded one left as it was."""
    if manifest is None or x.doc.manifest is not None:
        return x
    return Loaded(msgspec.structs.replace(x.doc, manifest=manifest), x.path, x.built, manifest)


@dataclass
class Side:
    """One side of a diff (or one run of a report): its primary summary and its repeats, each decoded once
    (`doc`, `docs`); `summary` and `repeats` give them as plain documents, for writers of them (gate's baseline)."""

    path: Path
    label: str
    first: Loaded
    others: list[Loaded] = field(default_factory=list)
    manifest: Any = None
    note: str | None = None  # a summary file that is one profile window of several, whose others were not found

    @property
    def doc(self) -> Summary:
        return self.first.doc

    @property
    def docs(self) -> list[Summary]:
        return [x.doc for x in self.others]

    @property
    def summary(self) -> dict[str, Any]:
        return self.first.plain()

    @property
    def repeats(self) -> list[dict[str, Any]]:
        return [x.plain() for x in self.others]


def read_json(path: Path) -> Any:
    """A JSON file, or TraceInputError naming the file and the problem."""
    return _parsed(_read_bytes(path), path)


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise TraceInputError(f"{path}: no such file", hint="check the path") from None
    except IsADirectoryError:
        raise TraceInputError(f"{path}: is a directory", hint="point at a summary.json or a run folder") from None
    except OSError as e:
        raise TraceInputError(f"{path}: cannot read ({e.strerror})", hint="check the file's permissions") from None


def _parsed(text: bytes, path: Path) -> Any:
    try:
        return json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceInputError(f"{path}: not valid JSON ({e})", hint="expected a summary.json or diff.json written by profkit, or a Kineto trace") from None


def is_summary(doc: Any) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("ranks"), list) and "schema_version" in doc


def is_diff_doc(doc: Any) -> bool:
    return isinstance(doc, dict) and "decomposition" in doc and "baseline" in doc and "candidate" in doc


SUMMARY_SCHEMA_READ = 3  # the newest summary.json schema this profkit reads (it reads every older one)
DIFF_SCHEMA_READ = 1


def check_summary(doc: Any, path: Path) -> dict[str, Any]:
    """A summary.json this profkit reads, as the JSON value it is (for writers of it), or TraceInputError."""
    checked_summary(doc, path)
    return doc


def checked_summary(doc: Any, path: Path) -> Summary:
    """A summary.json's JSON value this profkit reads, decoded once into its Summary, or TraceInputError saying what is wrong."""
    if not is_summary(doc):
        raise TraceInputError(f"{path}: not a profkit summary.json (no 'schema_version' and 'ranks')",
                              hint="write one with `profkit analyze TRACE --json summary.json`, or pass the trace itself")
    v = doc.get("schema_version")
    if not isinstance(v, int) or v > SUMMARY_SCHEMA_READ:
        raise TraceInputError(f"{path}: summary.json schema version {v!r}; this profkit reads versions 1 to 3",
                              hint="upgrade profkit, or re-run `profkit analyze` with this version")
    for r in doc["ranks"]:
        if not isinstance(r, dict) or not isinstance(r.get("iterations"), list):
            raise TraceInputError(f"{path}: a rank entry has no 'iterations' list", hint="the file is damaged or not a summary.json")
    try:  # every field where attribution and the renderers read it (profkit/documents.py): a bad one is the file's fault, said here
        return summary_of(doc)
    except msgspec.ValidationError as e:
        raise TraceInputError(f"{path}: not a valid summary.json ({e})",
                              hint="the file is damaged or was not written by profkit: re-run `profkit analyze` on the traces") from None


def check_diff(doc: Any, path: Path) -> Diff:
    """A diff.json's JSON value this profkit reads (schema version 1, every field of the type profkit/documents.py reads),
    decoded once into its Diff; or TraceInputError."""
    if not isinstance(doc, dict) or doc.get("schema_version") != DIFF_SCHEMA_READ:
        v = doc.get("schema_version") if isinstance(doc, dict) else None
        raise TraceInputError(f"{path}: diff.json schema version {v!r}; this profkit reads {DIFF_SCHEMA_READ}", hint="re-run profkit diff")
    try:
        return diff_of(doc)
    except msgspec.ValidationError as e:
        raise TraceInputError(f"{path}: not a valid diff.json ({e})", hint="the file is damaged or was not written by profkit: re-run profkit diff") from None


def read_diff(path: Path) -> Diff | None:
    """A diff.json file decoded once into its Diff (schema version 1); None where it is not one (read_json and
    check_diff then say why)."""
    try:
        d = diff_from_json(_read_bytes(path))
    except (msgspec.DecodeError, msgspec.ValidationError, TraceInputError):
        return None
    return d if d.schema_version == DIFF_SCHEMA_READ else None


def checked_diff(path: Path) -> Diff:
    """A diff.json this profkit reads, decoded once; or check_diff's TraceInputError."""
    d = read_diff(path)
    return d if d is not None else check_diff(read_json(path), path)


def _looks_like_trace(path: Path) -> bool:
    return path.name.endswith(_TRACE_NAMES)


def read_summary(path: Path) -> Summary | Any:
    """A summary.json file decoded once into its Summary (documents.summary_from_json), its schema version checked;
    anything else (a diff.json, a trace, a damaged file) as check_summary and read_json take it: the JSON value, or
    TraceInputError saying what is wrong."""
    text = _read_bytes(path)
    try:
        doc = summary_from_json(text)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raw = _parsed(text, path)
        return checked_summary(raw, path) if is_summary(raw) else raw
    if doc.schema_version > SUMMARY_SCHEMA_READ:
        raise TraceInputError(f"{path}: summary.json schema version {doc.schema_version!r}; this profkit reads versions 1 to 3",
                              hint="upgrade profkit, or re-run `profkit analyze` with this version")
    return doc


def load_document(path: Path, opts: SummarizeOptions, read: Any = None) -> Summary | dict[str, Any]:
    """One file -> a summary (of a trace: summarize, with the summary cache; of a summary.json: its Summary) or a
    diff document. `read`: what read_summary gave for the file, where the caller read it already."""
    if _looks_like_trace(path):
        return summarize([path], opts).summary
    doc = read_summary(path) if read is None else read
    if isinstance(doc, Summary):
        return doc
    if is_diff_doc(doc):
        return doc
    if isinstance(doc, dict) and "traceEvents" in doc or isinstance(doc, list):
        return summarize([path], opts).summary
    raise TraceInputError(f"{path}: neither a summary.json, a diff.json nor a Kineto trace",
                          hint="pass a summary.json (profkit analyze --json), a trace file, or a run folder")


def _manifest_near(path: Path) -> Any:
    for cand in (path / "manifest.json", path.parent / "manifest.json") if path.is_dir() else (path.parent / "manifest.json",):
        if cand.is_file():
            try:
                return json.loads(cand.read_text())
            except (OSError, ValueError):
                return None
    return None


def with_manifest(summary: dict[str, Any], manifest: Any) -> dict[str, Any]:
    """The summary with the run manifest found beside it as its `manifest` (reports and diff.json carry it): a
    new document, the loaded one (perhaps the summary cache's) left as it was; the summary as is when it has
    one, or none was found."""
    if manifest is None or "manifest" in summary:
        return summary
    return {**summary, "manifest": manifest}


def _label(path: Path) -> str:
    from profkit.ingest.identity import short_label

    p = path.resolve()
    if p.is_dir():
        return p.name
    if p.name in ("summary.json", "diff.json"):
        return p.parent.name
    return short_label(p.name)


def _run_label(summary: Summary) -> str | None:
    """The run id `profkit trace` wrote into the summary (its `run` section), else None."""
    run = run_of(summary.run)
    return run.run_id if run is not None and run.run_id else None


def _windows_expected(doc: Summary) -> int:
    """How many profile windows the summary's run had (its `run` section's profiler_overhead lists one per window)."""
    run = run_of(doc.run)
    ws = run.profiler_overhead.windows if run is not None and run.profiler_overhead is not None else None
    return len(ws) if ws is not None else 1


def _windows_of_summary(path: Path, doc: Summary) -> tuple[list[Loaded], str | None]:
    """The profile windows' summaries a summary file came with: `profkit trace` writes window 0 as the attribution
    folder's before.json / after.json and every window under reports/<run_id>/window-<i>/summary.json (the run id in
    the summary's `run` section), so they are looked for beside the file, in its folder's sibling <run_id>/ and in
    its own <run_id>/. ([], None) for a summary of one window; ([], what to pass) when the others are not found."""
    run = run_of(doc.run)
    rid = run.run_id if run is not None else None
    n = _windows_expected(doc)
    if run is None or not rid or n < 2:
        return [], None
    for folder in (path.parent.parent / rid, path.parent / rid, path.parent):
        found = sorted(folder.glob("window-*/summary.json"), key=lambda p: int(p.parent.name.split("-")[1])
                       if p.parent.name.split("-")[1].isdigit() else 0)
        docs = []
        for f in found:
            try:
                w = read_summary(f)
            except TraceInputError:  # unreadable or not JSON: said; a damaged summary: said only when it is this run's
                raw = read_json(f)
                if is_summary(raw) and (rr := run_of(raw.get("run"))) is not None and rr.run_id == rid:
                    check_summary(raw, f)
                continue
            if isinstance(w, Summary) and (wr := run_of(w.run)) is not None and wr.run_id == rid:
                docs.append(Loaded(w, f))
        if len(docs) >= 2:
            return docs, None
    return [], (f"{path} is profile window {0 if run.window is None else run.window} of the {n} of run {rid}, whose other windows are not beside it "
                f"(reports/{rid}/window-<i>/); the figures are one window's, not judged: pass the run folders, "
                f"profkit diff REPORTS/{rid} REPORTS/<the other run id> (REPORTS: where `trace` wrote them, --reports-dir)")


def load_side(path: Path, opts: SummarizeOptions, read: Any = None) -> Side:
    """A summary, trace or run folder -> Side (repeats loaded when the folder holds them). `read`: the file's
    read_summary, where the caller read it already."""
    path = Path(path)
    if not path.exists():
        raise TraceInputError(f"{path}: no such file or directory", hint="check the path")
    if path.is_file():
        got = load_document(path, opts, read)
        if not isinstance(got, Summary) and is_diff_doc(got):
            raise TraceInputError(f"{path}: is a diff.json; diff compares two summaries, traces or run folders",
                                  hint="use `profkit report DIFF.json` to render a diff")
        one = _loaded(got, None if _looks_like_trace(path) or not isinstance(got, Summary) else path)
        manifest = one.doc.manifest if isinstance(one.doc.manifest, dict) else _manifest_near(path)
        one = _given(one, manifest)
        windows, note = _windows_of_summary(path, one.doc)
        if windows:
            return Side(path, _run_label(one.doc) or _label(path), one, [_given(w, manifest) for w in windows], manifest)
        return Side(path, _run_label(one.doc) or _label(path), one, [], manifest, note)
    # repeats: repeat-*/ folders, or the profile windows of one run (window-<i>/, `trace --profile-windows`)
    repeat_dirs = sorted((p for p in path.iterdir() if p.is_dir() and p.name.startswith(("repeat", "window-"))),
                         key=lambda p: (p.name.split("-")[0], int(p.name.split("-")[1]) if p.name.split("-")[-1].isdigit() else 0, p.name))
    summaries: list[Loaded] = []
    for d in repeat_dirs:
        s = d / "summary.json"
        summaries.append(Loaded(_stored_summary(s), s) if s.is_file() else _loaded(summarize([d], opts).summary, None))
    if not summaries:
        own = path / "summary.json"
        if own.is_file():
            summaries = [Loaded(_stored_summary(own), own)]
        else:
            jsons = sorted(p for p in path.glob("*.json") if not _looks_like_trace(p) and p.name not in ("manifest.json", "diff.json"))
            for p in jsons:
                try:
                    doc = read_summary(p)
                except TraceInputError:
                    try:  # not JSON, or unreadable: not a summary, passed over; a summary.json that is damaged: said
                        json.loads(p.read_text())
                    except (OSError, ValueError):
                        continue
                    raise
                if isinstance(doc, Summary):
                    summaries.append(Loaded(doc, p))
    if not summaries:
        summaries = [_loaded(summarize([path], opts).summary, None)]
    first = summaries[0].doc
    manifest = first.manifest if isinstance(first.manifest, dict) else _manifest_near(path)
    summaries = [_given(x, manifest) for x in summaries]
    return Side(path, _label(path), summaries[0], summaries if len(summaries) > 1 else [], manifest)


def _stored_summary(path: Path) -> Summary:
    """A summary.json that must be one (check_summary's errors otherwise), decoded once."""
    doc = read_summary(path)
    return doc if isinstance(doc, Summary) else checked_summary(doc, path)


def load_pair(before: Path, after: Path, opts: SummarizeOptions) -> tuple[Side, Side, CatalogChoice, list[str]]:
    """The two sides of a diff, categorized under one catalog where it can be helped: when none was
    chosen (opts.catalog picks by kernel names) and the sides picked different ones, the side whose
    ranks did not all pick the more specific one (catalog.more_specific) is summarized again under it;
    a side that did (or was read from summary files, which no catalog changes) is kept as summarized,
    the same figures. The sides, the catalog choice they were summarized under, and warnings."""
    from profkit.analysis.catalog import CatalogChoice, load_catalog, more_specific

    b, c = load_side(before, opts), load_side(after, opts)
    choice = opts.catalog
    if choice.catalog is not None:
        return b, c, choice, []
    # each side picked its catalog by its own kernel names; categories only compare under one catalog
    picked = {s.doc.ranks[0].catalog for s in (b, c) if s.doc.ranks}
    name = more_specific(picked) if len(picked) > 1 else None
    if name is None:
        return b, c, choice, []
    choice = CatalogChoice(load_catalog(name), "kernel names")
    opts = replace(opts, catalog=choice)
    b = b if _under(b, name) else load_side(before, opts)
    c = c if _under(c, name) else load_side(after, opts)
    if {s.doc.ranks[0].catalog for s in (b, c)} != {choice.name}:
        return b, c, choice, [f"the two sides were categorized with different kernel catalogs; pass --catalog {choice.name} when analyzing them"]
    return b, c, choice, []


def _under(side: Side, name: str) -> bool:
    """Whether summarizing the side again under catalog `name` gives what it holds: each summary it made now
    (not read from a file) has every rank classified with `name` (picked by its kernel names, the same catalog)."""
    return all(r.catalog == name for x in (side.first, *side.others) if x.built is not None for r in x.doc.ranks)


def align_single_ranks(b: Side, c: Side, rank: int | None) -> tuple[int, list[str]]:
    """Two single-rank sides are compared whatever their ranks (rank 3 of one run against rank 1
    of another): the candidate's rank entry is renumbered to the baseline's, and said. Else --rank
    (default 0) on both."""
    rb, rc = b.doc.ranks, c.doc.ranks
    if rank is None and len(rb) == 1 and len(rc) == 1 and not b.others and not c.others:
        want: Any = rb[0].rank  # as written (None where the entry has none)
        have = rc[0].rank
        if want != have:
            c.first = replace(c.first, doc=msgspec.structs.replace(c.doc, ranks=[msgspec.structs.replace(rc[0], rank=want)]))
            return want, [f"single-rank sides: rank {want} of the baseline compared with rank {have} of the candidate"]
        return want, []
    return (0 if rank is None else rank), []


def infer_optimization(baseline_manifest: Any, candidate_manifest: Any) -> str | None:
    """The one optimization whose switch differs between the two manifests, else None.

    `profkit trace` writes ``optimizations`` as the state of every switch ({name: true/false}):
    the one switch whose state differs is the optimization (false -> true; true -> false, the
    candidate removing it, counts too). Also reads ``opt`` (a name), ``opts`` / ``optimizations``
    (a list or a comma-separated string: the one the candidate adds), at the top level or under
    ``config``. A summary's ``run`` section (what trace writes into summary.json) serves as its manifest.
    """
    def states(m: Any) -> dict[str, bool] | None:
        if not isinstance(m, dict):
            return None
        v = m.get("optimizations")
        if isinstance(v, dict) and v and all(isinstance(x, bool) for x in v.values()):
            return v
        return None

    sb, sc = states(baseline_manifest), states(candidate_manifest)
    if sb is not None and sc is not None:
        changed = [k for k in sorted(set(sb) | set(sc)) if sb.get(k, False) != sc.get(k, False)]
        return changed[0] if len(changed) == 1 else None

    def opts(m: Any) -> set[str] | None:
        if not isinstance(m, dict):
            return None
        config = m.get("config")
        for holder in (m, config if isinstance(config, dict) else {}):
            for key in ("optimizations", "opts", "opt"):
                v = holder.get(key)
                if isinstance(v, dict):
                    return {k for k, on in v.items() if on is True}
                if isinstance(v, str):
                    return {x.strip() for x in v.split(",") if x.strip()}
                if isinstance(v, list) and all(isinstance(x, str) for x in v):
                    return set(v)
        return None

    b, c = opts(baseline_manifest), opts(candidate_manifest)
    if c is None:
        return None
    extra = c - (b or set())
    return next(iter(extra)) if len(extra) == 1 else None


@dataclass
class Pointed:
    """One thing to analyze or render on its own: trace files/folders analyzed now, or a stored
    summary.json (of a run folder under reports/, a sweep, an attribution)."""

    label: str
    traces: list[Path] = field(default_factory=list)
    summary: Path | None = None


def _window(path: Path, wins: list[Path], window: int) -> Path:
    for w in wins:
        if w.name.split("-")[1] == str(window):
            return w
    raise TraceInputError(f"{path}: no profile window {window} (it has {', '.join(w.name + '/' for w in wins) or 'none'})",
                          hint="pick one of those with --window, or leave --window out for every window")


def _sweep_summaries(path: Path, window: int | None) -> list[Pointed]:
    doc = read_json(path / "sweep.json")
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if not isinstance(runs, list):
        raise TraceInputError(f"{path / 'sweep.json'}: no 'runs' list", hint="the file is damaged or not written by profkit sweep")
    out = []
    for r in runs:
        s = Path(str(r.get("summary") or ""))
        if window is not None:
            s = _window(s.parent, profile_windows_of(s.parent), window) / "summary.json"
        out.append(Pointed(str(r.get("label")), summary=s))
    return out


def profile_windows_of(path: Path) -> list[Path]:
    from profkit.ingest import profile_windows

    return profile_windows(path)


def analysis_inputs(paths: list[Path], window: int | None = None) -> tuple[list[Pointed], list[str]]:
    """What `analyze` and `export-perfetto` were pointed at -> the things each analyzes on its own,
    and notes for the user (files skipped). Any folder `trace` or `sweep` writes is accepted: a run
    folder of traces (each profile window on its own, or only --window i), a run folder of stored
    summaries (reports/<run>/), an attribution folder (its before.json and after.json), a sweep
    folder (each run's summary.json); loose trace files and plain trace folders are analyzed together."""
    from profkit.ingest import TRACE_SUFFIXES, is_sidecar, merged_beside_ranks, profile_windows, skipped_files

    loose: list[Path] = []
    out: list[Pointed] = []
    notes: list[str] = []
    for p in map(Path, paths):
        if p.name.endswith(TRACE_SUFFIXES) and p.suffix != ".json":  # a trace file by its name: no stat here (ingest opens it once)
            loose.append(p)
            continue
        if p.is_file():
            if p.suffix == ".json" and (is_sidecar(p.name) or is_summary_name(p.name)):
                out.append(Pointed(_label(p) if p.name == "summary.json" else p.stem, summary=p))
            else:
                loose.append(p)
            continue
        if not p.is_dir():
            loose.append(p)  # find_trace_files says what is wrong with it
            continue
        if (p / "sweep.json").is_file():
            out += _sweep_summaries(p, window)
            continue
        if (p / "diff.json").is_file() and (p / "before.json").is_file():
            out += [Pointed(f"{p.name}: {n}", summary=p / f"{n}.json") for n in ("before", "after") if (p / f"{n}.json").is_file()]
            continue
        wins = profile_windows(p)
        if wins:
            chosen = [_window(p, wins, window)] if window is not None else wins
            for w in chosen:
                has_traces = any(f.name.endswith((".json.gz", ".trace.json")) and not is_sidecar(f.name) for f in w.iterdir() if f.is_file())
                if has_traces:
                    out.append(Pointed(f"{p.name}/{w.name}", traces=[w]))
                elif (w / "summary.json").is_file():
                    out.append(Pointed(f"{p.name}/{w.name}", summary=w / "summary.json"))
            skipped = [n for n in skipped_files(p) if n != "summary.json" or window is not None]
            if skipped and any(x.traces for x in out):
                notes.append(f"{p}: skipped {', '.join(skipped)} (not traces)")
            continue
        if window is not None:
            raise TraceInputError(f"{p}: --window {window}, but the folder has no profile windows (window-<i>/)", hint="leave --window out")
        if (p / "summary.json").is_file() and not any(f.name.endswith(".trace.json.gz") for f in p.iterdir()):
            out.append(Pointed(_label(p), summary=p / "summary.json"))
            continue
        skipped = skipped_files(p)
        if skipped:
            shown = skipped if len(skipped) <= 6 else skipped[:5] + [f"and {len(skipped) - 5} more"]
            notes.append(f"{p}: skipped {', '.join(shown)} (not traces)")
        twice = merged_beside_ranks(sorted(f.name for f in p.iterdir() if f.is_file()))
        if twice:
            notes.append(f"{p}: skipped {', '.join(twice)} (SGLang's merge of the rank files beside it: the same ranks; "
                         "point at it alone to read it)")
        loose.append(p)
    if loose:
        out.insert(0, Pointed("", traces=loose))
    return out, notes


def is_summary_name(name: str) -> bool:
    return name in ("summary.json", "before.json", "after.json") or name.endswith(".summary.json")
