"""What `trace`, `sweep`, `calibrate` and `opts` ask of the stages that run engines, for the command
line, which reaches them only through flows/: the capture's run config and server command
(capture/run.py), the workload (workloads/agentic.py), the optimization registry and the targets'
checks (targets/: each engine's Target by its name), and a sweep's plan (capture/sweep.py). A facade: each name is the stage's own,
re-exported, so the command line depends on flows/ alone and each stage may move behind it."""

from __future__ import annotations

from profkit.capture.run import RunConfig, compose
from profkit.capture.sweep import Plan, check_sweep, label_slug, sweep_plan
from profkit.targets.engines import TARGETS, target
from profkit.targets.proxy import fault_args
from profkit.targets.registry import check_comparison, check_opts, opt_states, registry
from profkit.workloads.agentic import Workload, load_workload_file

__all__ = ["TARGETS", "Plan", "RunConfig", "Workload", "check_comparison", "check_opts", "check_sweep", "compose", "fault_args",
           "label_slug", "load_workload_file", "opt_states", "registry", "sweep_plan", "target"]
