"""Test helper: the live processes whose command line matches (what a test checks is left behind)."""

from __future__ import annotations

from typing import Callable

import psutil


def processes(match: Callable[[list[str]], bool]) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = p.info["cmdline"] or []
        except psutil.Error:
            continue
        if match(cmd):
            out.append(p)
    return out
