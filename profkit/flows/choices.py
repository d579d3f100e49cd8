"""The choices the command line offers that the stages below it declare: the `--target` names, one per
engine registered in targets/engines.py (so an engine's line there is its choice too). Read when the
command line starts, so it imports the engines' modules only (flows/engines.py, which the commands
run through, imports the capture as well)."""

from __future__ import annotations

from profkit.targets.engines import TARGETS

TARGET_NAMES: tuple[str, ...] = tuple(TARGETS)  # in their lines' order
BUILT_IN: str = next(n for n, t in TARGETS.items() if t.package is None)  # profkit's own engine (the proxy): the default
