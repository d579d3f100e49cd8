"""One protocol for every renderer: a `Report` (data computed before: diffs, runs, the ladder) in,
text out. Picked by name, or by the output file's suffix (.md, .html, .json); the terminal
renderer draws on a console.

Renderer modules are imported when picked: the HTML one needs the `report` extra (plotly,
jinja2), and the others must work without it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from importlib import import_module
from pathlib import Path
from typing import Any, ClassVar

from profkit.documents import Diff, Summary, diff_of, summary_of
from profkit.errors import UsageError


@dataclass(frozen=True)
class Report:
    """What a renderer renders, all of it computed before rendering.

    ``diffs``: diffs (`profkit.attribution.compare_summaries`' Diff, or diff.json read from a file); ``runs``: (label,
    summary.json) pairs; ``ladder``: for two runs or more, their ladder
    (`profkit.attribution.ladder_steps` of the same runs), which the HTML report draws; ``sweep``: a
    sweep's sweep.json (`profkit sweep`), whose `attribution` rows are ``diffs`` in order (what
    report/markdown_sweep.py renders).
    Renderers read them typed (`diff_docs`, `run_docs`: profkit.documents, decoded once per report; a Diff as is);
    diff.json is written from the document as given (a Diff encoded once: documents.diff_doc).
    """

    diffs: Sequence[Diff | Mapping[str, Any]] = ()
    runs: Sequence[tuple[str, Summary | Mapping[str, Any]]] = ()
    ladder: Sequence[Mapping[str, Any]] | None = None
    sweep: Mapping[str, Any] | None = None

    @cached_property
    def diff_docs(self) -> list[Diff]:
        return [diff_of(d) for d in self.diffs]

    @cached_property
    def run_docs(self) -> list[tuple[str, Summary]]:
        return [(label, summary_of(s)) for label, s in self.runs]

    def only_diff(self, renderer: str) -> Diff | Mapping[str, Any]:
        """The one diff of a report that holds nothing else (what Markdown and diff.json render)."""
        if len(self.diffs) != 1 or self.runs:
            raise ValueError(f"the {renderer} renderer renders one diff (got {len(self.diffs)} diffs and {len(self.runs)} runs)")
        return self.diffs[0]

    def only_diff_doc(self, renderer: str) -> Diff:
        """`only_diff`, typed."""
        self.only_diff(renderer)
        return self.diff_docs[0]


class Renderer(ABC):
    """Turns a Report into the text of one output. Subclasses take their options (``top``,
    ``cdn``, ...) as keyword arguments of their constructor."""

    name: ClassVar[str]
    output_file_extension: ClassVar[str]

    @abstractmethod
    def render(self, report: Report) -> str:
        """The output's whole text."""


# name -> "module:class"; imported when picked
RENDERERS = {
    "terminal": "profkit.report.terminal:TerminalRenderer",
    "markdown": "profkit.report.markdown:MarkdownRenderer",
    "html": "profkit.report.html:HtmlRenderer",
    "json": "profkit.report.jsonout:JsonRenderer",
}
SUFFIXES = {".md": "markdown", ".html": "html", ".json": "json"}


def get_renderer(name: str) -> type[Renderer]:
    """The renderer class registered under `name` (ImportError if its extra is not installed)."""
    try:
        module, cls = RENDERERS[name].split(":")
    except KeyError:
        raise UsageError(f"no renderer {name!r}", hint=f"one of: {', '.join(RENDERERS)}") from None
    renderer: type[Renderer] = getattr(import_module(module), cls)
    return renderer


def renderer_for(path: Path | str) -> type[Renderer]:
    """The renderer class for an output file, by its suffix: .md Markdown, .html HTML, .json diff.json."""
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIXES:
        raise UsageError(f"{path}: no renderer writes {suffix or 'files without a suffix'}",
                         hint=f"name the file {', '.join(f'*{s}' for s in SUFFIXES)}")
    return get_renderer(SUFFIXES[suffix])
