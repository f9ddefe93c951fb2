"""The step path's cost in this process (docs/figures/bench.md, "The cost of a step"): the
bench's 10-step mixed workflow driven by `runtime.run_step` with its messages captured (no
broker, no worker), as CPU time per step, so that what the engine itself spends is measured
apart from the broker and the machine's other work; then one personal field sealed and opened
(docs/privacy.md), the cost a workflow that declares personal fields adds per field.

Wall-clock rates depend on the load beside the bench; CPU time a little. For a figure the load
cannot move, run it under `valgrind --tool=callgrind` twice with different `--step-cost-runs`
and divide the difference of the instructions by the difference of the steps.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

from agentflow import durable
from agentflow._engine import runtime
from agentflow._privacy import envelope, keystore
from agentflow.testing import capture_messages
from config.bench import step_path, workload

#: Runs before the measured ones: imports, caches and the first connection are not the path.
WARM_UP = 20
ROUNDS = 3
#: Seal-and-open pairs timed for the per-field figure.
FIELDS = 2_000


def step_cost(runs: int, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """CPU microseconds per step (each of ROUNDS rounds of `runs` runs) and per personal field."""
    made: list[str] = [_one_run() for _ in range(WARM_UP)]
    per_step = []
    for round_no in range(1, ROUNDS + 1):
        progress(f"step cost: round {round_no} of {ROUNDS}, {runs:,} runs")
        gc.collect()
        began = time.process_time()
        made += [_one_run() for _ in range(runs)]
        per_step.append((time.process_time() - began) / (runs * workload.STEPS) * 1e6)
    durable.delete_runs(made)
    report: dict[str, Any] = {
        "runs": runs,
        "steps_per_run": workload.STEPS,
        "cpu_us_per_step": [round(value, 1) for value in per_step],
        "cpu_us_per_step_median": round(statistics.median(per_step), 1),
    }
    if keystore.enabled():
        report["personal_field_us"] = _field_cost()
    report["path"] = step_path.path_map()
    return report


def _one_run() -> str:
    run_id = durable.start(workload.MIXED, input={})
    with capture_messages():
        for seq in range(1, workload.STEPS + 1):
            runtime.run_step(run_id, seq)
    return run_id


def _field_cost() -> dict[str, float]:
    """Microseconds to seal one field under a subject's key, and to open it, the key known
    (as within a run: its key is read once and kept)."""
    [sealed] = durable.seal_personal([("bench@example.org", "words of the person, 60 chars")])
    key_id = sealed["k"]
    value = "My mother died on Monday; the funeral is on the day of my flight."
    began = time.process_time()
    texts = [envelope.seal_value(key_id, value) for _ in range(FIELDS)]
    sealing = time.process_time() - began
    began = time.process_time()
    for text in texts:
        envelope.open_value(text)
    opening = time.process_time() - began
    return {
        "seal": round(sealing / FIELDS * 1e6, 1),
        "open": round(opening / FIELDS * 1e6, 1),
    }
