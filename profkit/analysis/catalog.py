"""Kernel catalogs: ordered rules (data in ``kernels/*.toml``) that map GPU ops to categories.

A catalog says, for each GPU op (kernel, memcpy, memset), which *category* its time counts
under and, where known, which *optimization* owns it. The rules are data so that adding an
engine or a model family means adding a TOML file, not code; see ``kernels/README.md``.

This module only loads, validates and applies catalogs. It is separate from ``analysis`` because
the CLI (``profkit opts``), attribution (expected-effect check) and reports all read catalogs too.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal

from profkit.errors import UsageError
from profkit.terms import CAUSES, PHASES

if TYPE_CHECKING:
    import polars as pl

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = [
    "Catalog",
    "CatalogChoice",
    "Rule",
    "auto_catalog",
    "catalog_dir",
    "catalog_identity",
    "catalog_names",
    "choose_catalog",
    "load_catalog",
]

_TOP_KEYS = frozenset({"name", "description", "default_category", "signature", "rule", "optimizations"})
_RULE_KEYS = frozenset({"category", "pattern", "cats", "annotation", "owner"})
_OPT_KEYS = frozenset({"categories", "description", "phases", "idle", "grows", "grows_why"})
_FORMAT_HINT = "see kernels/README.md for the catalog format"
_CLASSIFY_CACHE_SIZE = 1 << 16


@dataclass(frozen=True)
class Rule:
    """One catalog rule. It matches an op when *every* matcher it has matches.

    ``pattern`` is searched (``re.search``) in the op name, ``cats`` must contain the op's Kineto
    ``cat``, ``annotation`` is searched in the name of the innermost enclosing
    ``record_function`` range (an op without one never matches an annotation rule).
    A loaded rule has at least one matcher.
    """

    category: str
    pattern: re.Pattern[str] | None
    cats: frozenset[str] | None
    annotation: re.Pattern[str] | None
    owner: str | None

    def matches(self, name: str, cat: str, annotation: str | None) -> bool:
        """Whether this rule applies to an op with this name, Kineto cat and enclosing range."""
        if self.cats is not None and cat not in self.cats:
            return False
        if self.pattern is not None and self.pattern.search(name) is None:
            return False
        if self.annotation is not None:
            if annotation is None or self.annotation.search(annotation) is None:
                return False
        return True


@dataclass(frozen=True)
class Catalog:
    """An ordered list of rules; the first rule that matches an op decides its category and owner.

    ``optimizations`` maps each optimization the catalog knows to the categories it is expected to
    change (empty for optimizations that change idle/launch time rather than kernels, such as
    overlap scheduling or CUDA graphs). Every rule ``owner`` is a key of ``optimizations``.
    ``optimization_phases`` and ``optimization_idle``: the phases (profkit.terms.PHASES) whose GPU time
    it is expected to shrink (none: not confined to one) and the bubble causes (profkit.terms.CAUSES)
    whose idle time it is expected to shrink; the diff's expected-effect check states these first.
    """

    name: str
    source: str
    description: str
    default_category: str
    rules: tuple[Rule, ...]
    signature: re.Pattern[str] | None
    optimizations: dict[str, tuple[str, ...]] = field(hash=False)
    optimization_descriptions: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    optimization_phases: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False, compare=False)
    optimization_idle: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False, compare=False)
    # the per-step work an optimization is expected to GROW (categories, "*" for every one) and why, in words: a
    # speculative verify step does 1 + k tokens' work where the decode step it replaces does 1 (issue 40)
    optimization_grows: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False, compare=False)
    optimization_grows_why: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    _cached: Callable[[str, str, str | None], tuple[str, str | None]] = field(
        init=False, repr=False, hash=False, compare=False
    )

    def __post_init__(self) -> None:
        # Per-instance cache: traces repeat a few thousand names millions of times.
        object.__setattr__(self, "_cached", lru_cache(maxsize=_CLASSIFY_CACHE_SIZE)(self._classify_uncached))

    def __getstate__(self) -> dict[str, Any]:
        # The per-instance cache wraps a bound method and does not pickle; rebuild it on load.
        state = dict(self.__dict__)
        state.pop("_cached", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__post_init__()

    @property
    def uses_annotations(self) -> bool:
        """Whether any rule looks at the enclosing range, i.e. callers should supply ``annotation``."""
        return any(r.annotation is not None for r in self.rules)

    @property
    def categories(self) -> tuple[str, ...]:
        """Every category this catalog can assign, in rule order, the default last."""
        seen = dict.fromkeys(r.category for r in self.rules)
        seen.setdefault(self.default_category, None)
        return tuple(seen)

    def classify(self, name: str, cat: str = "kernel", annotation: str | None = None) -> tuple[str, str | None]:
        """Return ``(category, owner)`` for one op: the first matching rule's, else ``(default, None)``."""
        return self._cached(name, cat, annotation)

    def _classify_uncached(self, name: str, cat: str, annotation: str | None) -> tuple[str, str | None]:
        for rule in self.rules:
            if rule.matches(name, cat, annotation):
                return rule.category, rule.owner
        return self.default_category, None

    def classify_frame(self, df: pl.DataFrame) -> pl.DataFrame:
        """Add ``category`` (String) and ``owner`` (String, null when no owner) to a frame of ops.

        Input columns: ``name`` (String), ``cat`` (String or Categorical) and optionally
        ``annotation`` (String, null when the op has no enclosing range). Rows keep their order;
        other columns pass through. A null ``name`` or ``cat`` is treated as the empty string.
        The rules run once per unique ``(name, cat, annotation)``, and the result is joined back.
        """
        import polars as pl  # here, not at the top: choosing a catalog (a cached `analyze`) imports no polars

        missing = [c for c in ("name", "cat") if c not in df.columns]
        if missing:
            raise ValueError(f"classify_frame needs columns name and cat; missing {missing}")
        if "category" in df.columns or "owner" in df.columns:
            raise ValueError("classify_frame: frame already has a 'category' or 'owner' column")
        has_ann = "annotation" in df.columns
        keys = df.select(
            pl.col("name").cast(pl.String).fill_null("").alias("_k_name"),
            pl.col("cat").cast(pl.String).fill_null("").alias("_k_cat"),
            (pl.col("annotation").cast(pl.String) if has_ann else pl.lit(None, dtype=pl.String)).alias("_k_ann"),
        )
        uniq = keys.unique()
        results = [
            self.classify(n, c, a)
            for n, c, a in zip(uniq["_k_name"].to_list(), uniq["_k_cat"].to_list(), uniq["_k_ann"].to_list())
        ]
        lookup = uniq.with_columns(
            pl.Series("category", [r[0] for r in results], dtype=pl.String),
            pl.Series("owner", [r[1] for r in results], dtype=pl.String),
        )
        joined = keys.join(
            lookup,
            on=["_k_name", "_k_cat", "_k_ann"],
            how="left",
            nulls_equal=True,
            maintain_order="left",
        )
        return df.with_columns(joined["category"], joined["owner"])


def catalog_dir() -> Path:
    """Where the shipped catalogs live: the checkout's ``kernels/``, else the wheel's ``_kernels``."""
    pkg = Path(__file__).resolve().parent.parent  # profkit/ (this module is profkit/analysis/catalog.py)
    repo = pkg.parent / "kernels"
    if repo.is_dir():
        return repo
    return pkg / "_kernels"


def catalog_names() -> list[str]:
    """Names of the shipped catalogs (the stems of ``*.toml`` in :func:`catalog_dir`), sorted."""
    d = catalog_dir()
    return sorted(p.stem for p in d.glob("*.toml")) if d.is_dir() else []


def load_catalog(spec: str | Path) -> Catalog:
    """Load a shipped catalog by name (``"generic"``) or a catalog file by path.

    A string counts as a path when it ends in ``.toml`` or contains a path separator.
    Raises :class:`UsageError` naming the file (and the rule, for rule errors) when the catalog is
    unknown, missing, not valid TOML, has unknown keys, wrong types, a bad regex, an owner that is
    not a declared optimization, or an optimization category no rule produces.
    """
    if isinstance(spec, Path) or spec.endswith(".toml") or "/" in spec or "\\" in spec:
        return _load_path(Path(spec))
    if spec not in catalog_names():
        raise UsageError(
            f"unknown kernel catalog {spec!r}",
            hint=f"shipped catalogs: {', '.join(catalog_names()) or '(none found)'}; or pass a path to a .toml",
        )
    return _load_shipped(spec)


def auto_catalog(kernel_names: Iterable[str]) -> Catalog:
    """Pick the shipped catalog whose ``signature`` matches the most distinct names; else ``generic``.

    Callers pass the kernel names of a trace (range names may be included: the proxy catalog's
    signature also recognizes its ``proxy.*`` ranges). Ties go to the catalog first in name order.
    """
    names = set(kernel_names)
    best: Catalog | None = None
    best_hits = 0
    for cat_name in catalog_names():
        catalog = _load_shipped(cat_name)
        if catalog.signature is None:
            continue
        sig = catalog.signature
        hits = sum(1 for n in names if sig.search(n) is not None)
        if hits > best_hits:
            best, best_hits = catalog, hits
    return best if best is not None else _load_shipped("generic")


def catalog_identity(catalog: Any) -> Any:
    """A catalog's one identity in every cache key (the per-option analysis cache, the stored
    summary): its name, source and every rule, so an edited .toml is another catalog. None: no
    catalog chosen, each rank picks by its kernel names (the picks are data the code fingerprint covers)."""
    if catalog is None:
        return None
    rules = [
        [r.category, getattr(r.pattern, "pattern", None), sorted(r.cats) if r.cats is not None else None,
         getattr(r.annotation, "pattern", None), r.owner]
        for r in getattr(catalog, "rules", ())
    ]
    return {
        "name": getattr(catalog, "name", str(catalog)), "source": str(getattr(catalog, "source", "")),
        "default": getattr(catalog, "default_category", None), "rules": rules,
        "signature": getattr(getattr(catalog, "signature", None), "pattern", None),
        "optimizations": {k: list(v) for k, v in sorted((getattr(catalog, "optimizations", None) or {}).items())},
    }


@dataclass(frozen=True)
class CatalogChoice:
    """The kernel catalog a command classifies with, and how it was chosen: `option` (--catalog),
    `manifest` (the run manifest's target), or `kernel names` (catalog None: each rank's analysis
    picks by its kernel names, auto_catalog). Made by choose_catalog and passed down as it is."""

    catalog: Catalog | None = None
    how: Literal["option", "manifest", "kernel names"] = "kernel names"

    @property
    def name(self) -> str | None:
        return None if self.catalog is None else self.catalog.name

    @property
    def identity(self) -> Any:
        return catalog_identity(self.catalog)

    def note(self) -> str | None:
        """The line that says a catalog was guessed from the manifest (None otherwise)."""
        if self.how == "manifest" and self.catalog is not None:
            return f"catalog {self.catalog.name}: from the run manifest's target (--catalog to choose another)"
        return None

    def for_effect(self, summary: Any, rank: int) -> Catalog | None:
        """The catalog that says which categories an optimization owns: this one, else the one the
        summary's rank was classified with (by its name; None when it cannot be loaded). The summary: a dict or
        a documents.Summary."""
        if self.catalog is not None:
            return self.catalog
        ranks = summary.get("ranks") if isinstance(summary, Mapping) else summary.ranks
        for r in ranks or []:
            rk, cat = (r.get("rank"), r.get("catalog")) if isinstance(r, Mapping) else (r.rank, r.catalog)
            if rk == rank and isinstance(cat, str):
                try:
                    return load_catalog(cat)
                except UsageError:
                    return None
        return None


def more_specific(names: Iterable[str | None]) -> str | None:
    """Of catalogs picked by kernel names (two sides of a diff), the one to categorize both with:
    the first by name that is not `generic`, else None."""
    specific = sorted(n for n in names if n and n != "generic")
    return specific[0] if specific else None


def picked_note(names: Iterable[str]) -> str:
    """The line that says which catalog(s) the ranks picked by their kernel names."""
    return f"catalog {', '.join(names)}: picked from the kernel names (--catalog NAME to choose)"


def choose_catalog(option: str | None, paths: Iterable[Path | str] = ()) -> CatalogChoice:
    """The one place that decides the catalog: --catalog when given, else the one the run
    manifest's target implies (manifest_catalog), else none (each rank picks by its kernel names)."""
    if option:
        return CatalogChoice(load_catalog(option), "option")
    name = manifest_catalog(paths)
    if name:
        return CatalogChoice(load_catalog(name), "manifest")
    return CatalogChoice()


def manifest_catalog(paths: Iterable[Path | str]) -> str | None:
    """The catalog a run's manifest implies, as its target says (Target.catalog: profkit's proxy engine -> proxy; vLLM ->
    vllm; SGLang running a GLM-5.x preset or model -> sglang-glm52), else None (pick by kernel names).
    The manifest: the run folder's manifest.json, one beside the trace, or <trace stem>.manifest.json."""
    import json

    from profkit.ingest.identity import short_label
    from profkit.targets.engines import TARGETS

    for p in paths:
        p = Path(p)
        cands = (p / "manifest.json",) if p.is_dir() else (p.parent / "manifest.json", p.with_name(f"{short_label(p.name)}.manifest.json"))
        for m in cands:
            try:
                doc = json.loads(m.read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(doc, dict):
                continue
            name = doc.get("target")
            engine = TARGETS.get(name) if isinstance(name, str) else None
            implied = engine.catalog(doc) if engine is not None else None
            if implied:
                return implied
    return None


@lru_cache(maxsize=None)
def _load_shipped(name: str) -> Catalog:
    return _load_path(catalog_dir() / f"{name}.toml")


def _load_path(path: Path) -> Catalog:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: kernel catalog not found", hint="pass a shipped name or an existing .toml") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot read kernel catalog: {e.strerror or e}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: not valid TOML: {e}", hint=_FORMAT_HINT) from None
    return _parse(data, path)


def _parse(data: Mapping[str, Any], path: Path) -> Catalog:
    _check_keys(data, _TOP_KEYS, f"{path}: top level")
    name = _req_str(data, "name", f"{path}: top level")
    description = _opt_str(data, "description", f"{path}: top level") or ""
    default_category = _opt_str(data, "default_category", f"{path}: top level") or "other"
    signature = _compile(data.get("signature"), f"{path}: signature")

    raw_opts = data.get("optimizations", {})
    if not isinstance(raw_opts, dict):
        raise _err(f"{path}: 'optimizations' must be a table of [optimizations.<name>] tables")
    optimizations: dict[str, tuple[str, ...]] = {}
    opt_descriptions: dict[str, str] = {}
    opt_phases: dict[str, tuple[str, ...]] = {}
    opt_idle: dict[str, tuple[str, ...]] = {}
    opt_grows: dict[str, tuple[str, ...]] = {}
    opt_grows_why: dict[str, str] = {}
    for opt, body in raw_opts.items():
        where = f"{path}: [optimizations.{opt}]"
        if not isinstance(body, dict):
            raise _err(f"{where} must be a table")
        _check_keys(body, _OPT_KEYS, where)
        cats = body.get("categories")
        if not isinstance(cats, list) or not all(isinstance(c, str) for c in cats):
            raise _err(f"{where}: 'categories' must be a list of strings (use [] for none)")
        optimizations[opt] = tuple(cats)
        opt_descriptions[opt] = _opt_str(body, "description", where) or ""
        for key, known, into in (("phases", PHASES, opt_phases), ("idle", CAUSES, opt_idle)):
            got = body.get(key, [])
            if not isinstance(got, list) or not all(isinstance(x, str) for x in got) or set(got) - set(known):
                raise _err(f"{where}: '{key}' must be a list of {', '.join(known)} (or [] for none)")
            into[opt] = tuple(got)
        grows = body.get("grows", [])
        if not isinstance(grows, list) or not all(isinstance(x, str) for x in grows):
            raise _err(f"{where}: 'grows' must be a list of categories, or [\"*\"] for every category (or [] for none)")
        why = _opt_str(body, "grows_why", where)
        if grows and not why:
            raise _err(f"{where}: 'grows' needs 'grows_why' (which per-step work grows, in words)")
        opt_grows[opt] = tuple(grows)
        opt_grows_why[opt] = why or ""

    raw_rules = data.get("rule", [])
    if not isinstance(raw_rules, list):
        raise _err(f"{path}: 'rule' must be an array of [[rule]] tables")
    rules: list[Rule] = []
    for i, body in enumerate(raw_rules, start=1):
        rules.append(_parse_rule(body, f"{path}: [[rule]] #{i}", optimizations))

    produced = {r.category for r in rules} | {default_category}
    for opt, cats in optimizations.items():
        unknown = sorted(set(cats) - produced)
        if unknown:
            raise _err(
                f"{path}: [optimizations.{opt}]: categories {unknown} are not produced by any rule",
                hint=f"categories of this catalog: {', '.join(sorted(produced))}",
            )
    return Catalog(
        name=name,
        source=str(path),
        description=description,
        default_category=default_category,
        rules=tuple(rules),
        signature=signature,
        optimizations=optimizations,
        optimization_descriptions=opt_descriptions,
        optimization_phases=opt_phases,
        optimization_idle=opt_idle,
        optimization_grows=opt_grows,
        optimization_grows_why=opt_grows_why,
    )


def _parse_rule(body: Any, where: str, optimizations: Mapping[str, tuple[str, ...]]) -> Rule:
    if not isinstance(body, dict):
        raise _err(f"{where} must be a table")
    _check_keys(body, _RULE_KEYS, where)
    category = _req_str(body, "category", where)
    where = f"{where} (category {category!r})"
    pattern = _compile(body.get("pattern"), f"{where}: pattern")
    annotation = _compile(body.get("annotation"), f"{where}: annotation")
    cats: frozenset[str] | None = None
    if "cats" in body:
        raw = body["cats"]
        if not isinstance(raw, list) or not raw or not all(isinstance(c, str) for c in raw):
            raise _err(f"{where}: 'cats' must be a non-empty list of strings")
        cats = frozenset(raw)
    if pattern is None and cats is None and annotation is None:
        raise _err(f"{where}: needs at least one of 'pattern', 'cats', 'annotation'")
    owner = _opt_str(body, "owner", where)
    if owner is not None and owner not in optimizations:
        raise _err(
            f"{where}: owner {owner!r} is not a declared optimization",
            hint=f"add an [optimizations.{owner}] table, or use one of: {', '.join(optimizations) or '(none)'}",
        )
    return Rule(category=category, pattern=pattern, cats=cats, annotation=annotation, owner=owner)


def _err(message: str, *, hint: str = _FORMAT_HINT) -> UsageError:
    return UsageError(message, hint=hint)


def _check_keys(table: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise _err(f"{where}: unknown key(s) {unknown}", hint=f"allowed keys: {', '.join(sorted(allowed))}")


def _req_str(table: Mapping[str, Any], key: str, where: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value:
        raise _err(f"{where}: '{key}' is required and must be a non-empty string")
    return value


def _opt_str(table: Mapping[str, Any], key: str, where: str) -> str | None:
    value = table.get(key)
    if value is not None and not isinstance(value, str):
        raise _err(f"{where}: '{key}' must be a string")
    return value


def _compile(value: Any, where: str) -> re.Pattern[str] | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise _err(f"{where}: must be a non-empty string (a Python regex)")
    try:
        return re.compile(value)
    except re.error as e:
        hint = "patterns are Python `re` syntax, searched anywhere in the string"
        raise _err(f"{where}: bad regex {value!r}: {e}", hint=hint) from None
