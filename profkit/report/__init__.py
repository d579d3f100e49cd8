"""Renderers: report data (diff.json, summary.json, a sweep's ladder) -> terminal tables, Markdown,
HTML, diff.json. One protocol (`Renderer`, `Report`) in base.py; one number formatter in
numbers.py; the words every renderer shares in views.py (diffs), vocab.py (device timelines) and
profkit.attribution.findings (why the GPU is idle)."""

from profkit.report.base import Renderer, Report, get_renderer, renderer_for

__all__ = ["Renderer", "Report", "get_renderer", "renderer_for"]
