"""diff.json as profkit writes it to a file: one-space indented JSON, UTF-8, ending in a newline."""

from __future__ import annotations

from typing import ClassVar

from profkit.documents import Diff, diff_doc
from profkit.report.base import Renderer, Report
from profkit.store import json_text


class JsonRenderer(Renderer):
    name: ClassVar[str] = "json"
    output_file_extension: ClassVar[str] = "json"

    def render(self, report: Report) -> str:
        d = report.only_diff("diff.json")
        return json_text(diff_doc(d) if isinstance(d, Diff) else d)  # a diff.json read from a file: written as given
