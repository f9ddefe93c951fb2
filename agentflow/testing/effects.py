"""What a run's effects did, checked from the engine's rows and, if given, the partner's."""

from __future__ import annotations

from collections.abc import Callable

from agentflow import durable
from agentflow._base.states import StepKind, StepStatus

__all__ = ["assert_effects_once"]


def assert_effects_once(
    run_id: str, *, partner: Callable[[str], int] | None = None
) -> dict[str, int]:
    """Assert that every effect of the run is settled and happened at most once.

    From the engine's rows: no step is left IN_PROGRESS (claimed by a worker that never
    finished), and every effect step either COMPLETED (it happened, under its idempotency
    key) or FAILED for good (it did not happen); none is FAILED-retryable, whose outcome is
    still unknown. Idempotency keys are unique per checkpoint, so each key completed once.

    `partner(key)`: how many times the partner itself recorded the effect made under `key`
    (a row in its table, a line in its file). Then each completed effect must count exactly 1
    there and each failed one 0: "happened once" is checked apart from the engine's word.

    Returns {idempotency key: times it happened} for the run's effect steps.
    """
    run = durable.snapshot(run_id)
    assert run is not None, f"there is no workflow run {run_id!r}"
    problems: list[str] = []
    happened: dict[str, int] = {}
    for step in run.steps:
        where = f"step {step.seq} {step.name} ({step.kind})"
        if step.status == StepStatus.IN_PROGRESS:
            problems.append(f"{where} is still IN_PROGRESS: claimed and never finished")
            continue
        if step.kind != StepKind.EFFECT:
            continue
        if step.status == StepStatus.FAILED and step.retryable:
            problems.append(f"{where} FAILED retryable: whether it happened is not known yet")
            continue
        expected = 1 if step.status == StepStatus.COMPLETED else 0
        count = partner(step.idempotency_key) if partner is not None else expected
        happened[step.idempotency_key] = count
        if count != expected:
            said = "completed" if expected else "failed (did not happen)"
            problems.append(
                f"{where} {said} under key {step.idempotency_key}, but the partner "
                f"recorded it {count} times"
            )
    assert not problems, f"run {run_id} ({run.status}): " + "; ".join(problems)
    return happened
