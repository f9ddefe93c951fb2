"""The path of a step, mapped (docs/figures/bench.md, "The path of a step"): a run of two steps,
a read then an effect, carried from start to end by `runtime.run_step` in this process with its
messages captured, under `sys.setprofile`. It says which engine modules the run's steps call
into and how often control moves from one module to another (two calls in a row in different
modules): how scattered the path is for a reader, not what it costs.
"""

from __future__ import annotations

import sys
from collections import Counter
from types import FrameType
from typing import Any

from agentflow import durable
from agentflow._engine import runtime
from agentflow.testing import capture_messages
from config.bench import workload


def path_map() -> dict[str, Any]:
    """{"modules": {module: calls}, "modules_entered": n, "moves": m} of one run, warmed up."""
    _drive(durable.start(workload.READ_THEN_EFFECT, input={}), None)  # imports and caches
    calls: Counter[str] = Counter()
    moves = 0
    last = ""

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal moves, last
        module = frame.f_globals.get("__name__", "")
        if event != "call" or not module.startswith("agentflow"):
            return
        if module.startswith("agentflow.testing"):
            return  # the captured messages' outbox: this measurement's, not the engine's
        calls[module] += 1
        if last and module != last:
            moves += 1
        last = module

    _drive(durable.start(workload.READ_THEN_EFFECT, input={}), profile)
    return {"modules_entered": len(calls), "moves": moves, "modules": dict(sorted(calls.items()))}


def _drive(run_id: str, profile: Any) -> None:
    with capture_messages():
        for seq in (1, 2):
            sys.setprofile(profile)
            try:
                runtime.run_step(run_id, seq)
            finally:
                sys.setprofile(None)
    durable.delete_runs([run_id])
