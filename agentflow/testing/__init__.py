"""Testing helpers for the test suites of projects that use agentflow, and the tooling our
own suite, bench and chaos share.

In-process, against the real database, without a broker or a worker:

- `run_to_end(run_id)` plays the worker until the run is finished or parked and returns its
  `durable.RunSnapshot`; `capture_messages()` keeps the step messages the engine publishes
  (an `Outbox`) instead of sending them to a broker.
- `crash_at("STEP:POINT")` makes the first attempt of STEP die at a crash point
  (`after_claim`, `after_effect`, `after_complete`) as a SIGKILLed worker would; the run
  then recovers as in production.
- `assert_effects_once(run_id, partner=...)` checks the run's effects from the engine's rows,
  and from the partner's own record when given.

With real processes: `crash_env("STEP:POINT")` is the environment that makes a real worker
SIGKILL itself there, and the pytest plugin (`agentflow.testing.pytest_plugin`, loaded
automatically once agentflow is installed) has the `agentflow_worker` fixture, which starts
`celery -A <your app> worker` on the test database and stops it after the test, and
`agentflow_outbox`; `wait_for_run(run_id)` waits (with a deadline) until a run such a worker
drives has stopped. Real worker, Redis and PostgreSQL processes on demand are `processes`,
waiting on them `waiting`.

Nothing in the engine's runtime imports this package (pyproject.toml's import contracts). Its
names load on first use, so importing it (as pytest does with the plugin) touches no model
before Django is set up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentflow.testing.effects import assert_effects_once
    from agentflow.testing.inprocess import (
        Crash,
        Outbox,
        SimulatedCrash,
        StepMessage,
        capture_messages,
        crash_at,
        crash_env,
        run_to_end,
    )
    from agentflow.testing.observing import wait_for_run

_EXPORTS = {
    "Crash": "inprocess",
    "StepMessage": "inprocess",
    "Outbox": "inprocess",
    "SimulatedCrash": "inprocess",
    "capture_messages": "inprocess",
    "crash_at": "inprocess",
    "crash_env": "inprocess",
    "run_to_end": "inprocess",
    "assert_effects_once": "effects",
    "wait_for_run": "observing",
}

__all__ = [
    "Crash",
    "Outbox",
    "SimulatedCrash",
    "StepMessage",
    "assert_effects_once",
    "capture_messages",
    "crash_at",
    "crash_env",
    "run_to_end",
    "wait_for_run",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentflow.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"agentflow.testing.{module}"), name)
    globals()[name] = value
    return value
