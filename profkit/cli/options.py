"""Every option that more than one command takes, declared once: its flags, its help, its type and
its validation (sqlite-utils' `output_options` is the model). A value, range or choice is refused by
click while it parses, so every command refuses it with the same line and exit 2 (common.py prints
click's usage errors as one line). Choices are enums.

A command takes a shared option as a parameter annotated with its alias (`min_bubble_us: MinBubble = 2.0`),
or, for trace and sweep, as a field of RunOptions declared with `Shared.field`."""

from __future__ import annotations

import dataclasses
import re
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Optional

import typer

from profkit.flows.choices import BUILT_IN, TARGET_NAMES


class Choice(str, Enum):
    """A fixed set of values; prints as its value (in run ids, manifests, messages)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


# The --target choices: every engine registered in targets/engines.py, by its name (a new engine's line there is its
# choice here too). Typer reads the members at run time; mypy, which cannot list members computed at import time,
# reads TargetName as the Choice each member is.
if TYPE_CHECKING:
    TargetName = Choice
else:
    TargetName = Choice("TargetName", {n: n for n in TARGET_NAMES})
DEFAULT_TARGET = TargetName(BUILT_IN)  # the proxy, which runs anywhere


class BaseMode(Choice):
    on = "on"
    off = "off"


class SweepMode(Choice):
    one_at_a_time = "one-at-a-time"
    ladder = "ladder"
    leave_one_out = "leave-one-out"


def _regex(value: Optional[str]) -> Optional[str]:
    if value is None:
        return None
    try:
        re.compile(value)
    except re.error as e:
        raise typer.BadParameter(f"{value!r} is not a regular expression ({e})") from None
    return value


def _checked(value: Any, load: Callable[[Any], Any]) -> Any:
    """An option's value once `load` took it; its UsageError as typer's bad-parameter error (None: not given)."""
    if value is None:
        return None
    from profkit.errors import UsageError

    try:
        load(value)
    except UsageError as e:
        raise typer.BadParameter(str(e) + (f"; {e.hint}" if e.hint else "")) from None
    return value


def _catalog(value: Optional[str]) -> Optional[str]:
    from profkit.flows.options import load_catalog

    return _checked(value, load_catalog)


@dataclasses.dataclass(frozen=True)
class Shared:
    """One option's declaration: flags, help, and the typer.Option keywords that type and check it."""

    flags: tuple[str, ...]
    help: str
    kw: dict[str, Any] = dataclasses.field(default_factory=dict)

    def option(self, help: str | None = None) -> Any:
        return typer.Option(*self.flags, help=help or self.help, **self.kw)

    def meta(self) -> dict[str, Any]:
        """RunOptions' field metadata (common.options_from reads it)."""
        return {"flags": self.flags, "help": self.help, "typer": self.kw}

    def field(self, default: Any) -> Any:
        return dataclasses.field(default=default, metadata=self.meta())


def either(names: list[str]) -> str:
    """"a, b or c"."""
    return " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


TARGET = Shared(("--target",), either([n + " (the built-in engine)" if n == BUILT_IN else n for n in TARGET_NAMES]) + ".")
BASE = Shared(("--base",), "on (default, the study's regime): all on, baseline = all on minus opts (leave-one-out); "
              "off (exploration): baseline all off, candidate = baseline + opts.")
MARKER = Shared(("--marker",), "Regex for the CPU span that opens one iteration (default chain: scheduler.run_batch, step\\[...], "
                "execute_..., ProfilerStep#N); for traces analyzed now.", {"callback": _regex})
MIN_BUBBLE_US = Shared(("--min-bubble-us",), "Shortest GPU idle gap counted as a bubble (µs); for traces analyzed now.", {"min": 0.0})
CATALOG = Shared(("--catalog",), "Kernel catalog: a name in kernels/ (generic, sglang-glm52, proxy, vllm) or a .toml path, for traces "
                 "analyzed now (default: the one the run manifest's target implies, else picked from the kernel names).",
                 {"callback": _catalog})
CDN = Shared(("--cdn",), "Load plotly.js from its CDN (a small file that needs the network) instead of inlining it.")
TOP = Shared(("--top",), "How many kernels (analyze), movers and sync groups (diff) to print.", {"min": 1})
CAPTURE = Shared(("--capture",), "Graph-capture profile(s) (SGLang's or the proxy's graph_capture_profile/*.json.gz): replayed kernels "
                 "categorized as in eager mode (default: graph_capture_profile/ of each run folder).")
JSON_OUT = Shared(("--json",), "Write the command's JSON document (analyze: summary.json, schema v3; diff: diff.json, schema v1) to FILE, or '-' for stdout.")
MD = Shared(("--md",), "Write a GitHub Markdown PR comment to FILE.")
OUTPUT = Shared(("--output", "-o"), "The file to write (default: under reports/, or beside the trace).")

def _peaks(value: Optional[Path]) -> Optional[Path]:
    from profkit.flows.options import load_peaks

    return _checked(value, load_peaks)


PEAKS = Shared(("--peaks",), "Measured peaks (TOML, as benchmarks/gpu_peaks.py writes) for the hardware floor of traces recorded with "
               "shapes; default: kernels/peaks/datasheet.toml's figures for the trace's device.", {"callback": _peaks})
STRICT = Shared(("--strict",), "Exit 5 when capture health is not ok (degraded or unusable), after writing every output.")
WINDOW = Shared(("--window",), "Of a run folder of profile windows (window-<i>/): window i only (default: each window on its own).", {"min": 0})

Target = Annotated[TargetName, TARGET.option()]
Marker = Annotated[Optional[str], MARKER.option()]
MinBubble = Annotated[float, MIN_BUBBLE_US.option()]
CatalogOpt = Annotated[Optional[str], CATALOG.option()]
Cdn = Annotated[bool, CDN.option()]
Top = Annotated[int, TOP.option()]
Captures = Annotated[Optional[list[Path]], CAPTURE.option()]
Output = Annotated[Optional[Path], OUTPUT.option()]
JsonOut = Annotated[Optional[str], JSON_OUT.option()]
Window = Annotated[Optional[int], WINDOW.option()]
Strict = Annotated[bool, STRICT.option()]
PeaksOpt = Annotated[Optional[Path], PEAKS.option()]
