"""One exploration of the money machine (`refunds.chaos.model`): `manage.py chaos --model` and
the suite's test both run it, at their own budgets, and read the same figures."""

from __future__ import annotations

import time
from typing import Any

from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis.errors import Flaky
from hypothesis.reporting import with_reporter
from hypothesis.stateful import run_state_machine_as_test

from refunds.chaos.model import Figures, machine
from refunds.chaos.partners import Partners
from refunds.chaos.seams import Seams

#: Rules per example: enough for a refund to reach its charge, be interfered with, and end.
DEFAULT_STEPS = 40


def explore(
    *,
    sandbox_url: str,
    examples: int,
    steps: int = DEFAULT_STEPS,
    seed_value: int | None = None,
    partner_settings: dict[str, Any] | None = None,
    shrink: bool = True,
) -> dict[str, Any]:
    """Run `examples` examples of at most `steps` rules each; return the figures and, if an
    invariant broke, the smallest sequence of rules found that breaks it (Hypothesis's own
    report, which replays it). Deterministic for a given `seed_value` (None: derandomized)."""
    seams, figures = Seams(), Figures()
    machine_class = machine(seams, Partners(sandbox_url), figures)
    if seed_value is not None:
        machine_class = seed(seed_value)(machine_class)
    phases = [Phase.explicit, Phase.generate, *([Phase.shrink] if shrink else [])]
    budget = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        derandomize=seed_value is None,
        database=None,
        phases=phases,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )
    report: list[object] = []
    started = time.monotonic()
    violations = []
    with seams.taken(partner_settings or {}), with_reporter(report.append):
        try:
            run_state_machine_as_test(machine_class, settings=budget)
        except (AssertionError, Flaky, ExceptionGroup) as exc:
            violations = _explained(exc)
    return {
        **figures.as_json(),
        "seed": seed_value,
        "steps_per_example": steps,
        "seconds": round(time.monotonic() - started, 1),
        "violations": violations,
        "hypothesis_said": [str(line) for line in report],
    }


def replay(
    *,
    sandbox_url: str,
    rules: list[tuple[str, dict[str, Any]]],
    partner_settings: dict[str, Any] | None = None,
) -> None:
    """One example as a written list of (rule, arguments), checked as Hypothesis checks it:
    the invariants after every rule, the end in teardown. Raises AssertionError on a violation
    (for sequences found once and kept, such as each finding's)."""
    seams, figures = Seams(), Figures()
    with seams.taken(partner_settings or {}):
        state = machine(seams, Partners(sandbox_url), figures)()
        try:
            for name, arguments in rules:
                getattr(state, name)(**arguments)
                state.money_and_liveness()
        finally:
            state.teardown()


def _explained(exc: BaseException) -> list[dict[str, Any]]:
    """Each distinct failure Hypothesis found: what broke, and the minimal sequence of rules
    that breaks it (Hypothesis attaches that to the exception as notes)."""
    if isinstance(exc, BaseExceptionGroup):
        return [found for sub in exc.exceptions for found in _explained(sub)]
    return [
        {
            "broken": f"{type(exc).__name__}: {exc}"[:4000],
            "minimal_sequence": [
                line for note in getattr(exc, "__notes__", []) for line in note.splitlines()
            ],
        }
    ]
