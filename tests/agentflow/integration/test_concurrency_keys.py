"""Concurrency keys and priorities in the store, in this process (docs/workflows.md): who is
admitted at start, who waits and in which order, who goes when a run ends, and what the
sweeper repairs when that hand-off was lost. Real workers: tests/agentflow/acceptance/
test_priorities_and_keys.py."""

from __future__ import annotations

from typing import Any

import pytest

from agentflow import _store as store
from agentflow import durable, testing
from agentflow._base.states import RunStatus
from agentflow._engine import runtime
from agentflow._recovery import sweeper
from agentflow.models import ConcurrencyKey, RunEvent, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)


def _noop(ctx: durable.StepContext) -> dict[str, Any]:
    return {}


def _booking(input: dict[str, Any]) -> str:
    return str(input["booking"])


one_at_a_time = durable.Workflow(
    "keys_one_at_a_time", version=1, concurrency_key=_booking, concurrency_limit=1, priority=6
)
one_at_a_time.step("only", kind="read")(_noop)
two_at_a_time = durable.Workflow(
    "keys_two_at_a_time", version=1, concurrency_key=_booking, concurrency_limit=2
)
two_at_a_time.step("only", kind="read")(_noop)


_failed_once: set[str] = set()


def _fails_first(ctx: durable.StepContext) -> dict[str, Any]:
    if ctx.run_id not in _failed_once:
        _failed_once.add(ctx.run_id)
        raise durable.PermanentStepError("the partner said no, this time")
    return {}


failing_once = durable.Workflow(
    "keys_failing_once", version=1, concurrency_key=_booking, concurrency_limit=1
)
failing_once.step("only", kind="read")(_fails_first)


def start(workflow: durable.Workflow, booking: str, **options: Any) -> str:
    return durable.start(workflow.name, input={"booking": booking}, **options)


def status(run_id: str) -> str:
    return WorkflowRun.objects.get(pk=run_id).status


def digest_of(run_id: str) -> str:
    return WorkflowRun.objects.get(pk=run_id).concurrency_key


def test_start__over_the_cap_waits_with_the_reason__keys_apart() -> None:
    with testing.capture_messages() as outbox:
        first, second, third = (start(one_at_a_time, "ABC123") for _ in range(3))
        other = start(one_at_a_time, "XYZ789")
    assert [status(r) for r in (first, second, third, other)] == [
        RunStatus.PENDING,
        RunStatus.WAITING,
        RunStatus.WAITING,
        RunStatus.PENDING,
    ]
    assert {m.run_id for m in outbox.messages} == {first, other}  # nothing out for a waiter
    held = durable.snapshot(second)
    assert held is not None and held.held == (
        "waiting for its turn: another run of keys_one_at_a_time with the same concurrency key "
        "is running"
    )
    assert store.concurrency_waiting(digest_of(first)) == [second, third]  # arrival order
    assert digest_of(first) == digest_of(second) != digest_of(other)
    assert "ABC123" not in digest_of(first)


def test_end__admits_the_oldest_waiter_only__and_the_key_row_goes_with_the_last_run() -> None:
    with testing.capture_messages():
        first, second, third = (start(one_at_a_time, "ABC123") for _ in range(3))
    assert testing.run_to_end(first).status == RunStatus.COMPLETED
    assert [status(second), status(third)] == [RunStatus.PENDING, RunStatus.WAITING]
    assert RunEvent.objects.filter(run_id=second, kind=RunEvent.Kind.RELEASED).exists()
    assert testing.run_to_end(third).status == RunStatus.WAITING  # its turn has not come
    testing.run_to_end(second)
    assert testing.run_to_end(third).status == RunStatus.COMPLETED
    assert not ConcurrencyKey.objects.exists()


def test_cap_of_two__two_run_the_third_waits() -> None:
    with testing.capture_messages():
        runs = [start(two_at_a_time, "ABC123") for _ in range(3)]
    assert [status(r) for r in runs] == [RunStatus.PENDING, RunStatus.PENDING, RunStatus.WAITING]
    testing.run_to_end(runs[1])
    assert status(runs[2]) == RunStatus.PENDING


def test_a_parked_run_keeps_its_place() -> None:
    with testing.capture_messages():
        first, second = (start(one_at_a_time, "ABC123") for _ in range(2))
    WorkflowRun.objects.filter(pk=first).update(status=RunStatus.NEEDS_ATTENTION, wake_at=None)
    assert store.concurrency_release(digest_of(first)) == []
    assert status(second) == RunStatus.WAITING


def test_retry_of_a_failed_run__goes_back_through_its_key__waits_while_another_holds_it() -> None:
    with testing.capture_messages():
        first, second = (start(failing_once, "ABC123") for _ in range(2))
        assert testing.run_to_end(first, retries=False).status == RunStatus.FAILED
    assert status(second) == RunStatus.PENDING  # the failed run gave its place up

    with testing.capture_messages() as outbox:
        durable.retry(first, actor="ops", reason="the partner is fine now")
    assert status(first) == RunStatus.WAITING and outbox.messages == []  # second holds the key
    held = durable.snapshot(first)
    assert held is not None and held.held.startswith("waiting for its turn: another run")

    with testing.capture_messages():
        assert testing.run_to_end(second).status == RunStatus.FAILED  # fails once too
    assert status(first) == RunStatus.PENDING  # admitted as the other ended
    assert testing.run_to_end(first).status == RunStatus.COMPLETED
    kinds = list(
        RunEvent.objects.filter(run_id=first).order_by("id").values_list("kind", flat=True)
    )
    after_retry = kinds[kinds.index(RunEvent.Kind.OPERATOR_RETRY) :]
    assert after_retry[:2] == [RunEvent.Kind.OPERATOR_RETRY, RunEvent.Kind.HELD], kinds
    assert RunEvent.Kind.RELEASED in after_retry, kinds


def test_sweeper__admits_the_next_when_the_hand_off_was_lost() -> None:
    with testing.capture_messages():
        first, second = (start(one_at_a_time, "ABC123") for _ in range(2))
    # Ended, and the process died before it admitted the next (no release ran).
    WorkflowRun.objects.filter(pk=first).update(status=RunStatus.COMPLETED, wake_at=None)
    with testing.capture_messages() as outbox:
        sweeper.sweep()
    assert status(second) == RunStatus.PENDING
    assert [m.run_id for m in outbox.messages] == [second]
    assert testing.run_to_end(second).status == RunStatus.COMPLETED


def test_a_stray_message_for_a_waiting_run_does_nothing() -> None:
    with testing.capture_messages():
        _, second = (start(one_at_a_time, "ABC123") for _ in range(2))

    runtime.run_step(second, 1)
    assert status(second) == RunStatus.WAITING and not durable.snapshot(second).steps  # type: ignore[union-attr]


def test_cancel_of_a_waiting_run__ends_it__the_others_keep_their_order() -> None:
    with testing.capture_messages():
        first, second, third = (start(one_at_a_time, "ABC123") for _ in range(3))
        durable.cancel(second, actor="ops", reason="sent twice")
    assert status(second) == RunStatus.CANCELLED
    testing.run_to_end(first)
    assert status(third) == RunStatus.PENDING


@pytest.mark.parametrize(("given", "default", "stored"), [(None, None, 6), (9, None, 9), (0, 3, 0)])
def test_priority__the_start_s_else_the_workflow_s(
    given: int | None, default: int | None, stored: int, settings: Any
) -> None:
    settings.AGENTFLOW_DEFAULT_PRIORITY = default
    with testing.capture_messages():
        run_id = start(one_at_a_time, "P1", priority=given)
    assert WorkflowRun.objects.get(pk=run_id).priority == stored
    assert durable.snapshot(run_id).priority == stored  # type: ignore[union-attr]


def test_priority__the_default_setting_for_a_workflow_without_one(settings: Any) -> None:
    settings.AGENTFLOW_DEFAULT_PRIORITY = 4
    with testing.capture_messages():
        run_id = start(two_at_a_time, "P2")
    assert WorkflowRun.objects.get(pk=run_id).priority == 4


@pytest.mark.parametrize(
    ("options", "input"),
    [
        ({"priority": 10}, {"booking": "A"}),
        ({"priority": "high"}, {"booking": "A"}),
        ({}, {"no booking": "A"}),
        ({}, {"booking": ""}),
    ],
)
def test_bad_start__invalid_input__nothing_created(options: dict[str, Any], input: Any) -> None:
    with testing.capture_messages(), pytest.raises(durable.InvalidInputError):
        durable.start(one_at_a_time.name, input=input, **options)
    assert not WorkflowRun.objects.exists()
