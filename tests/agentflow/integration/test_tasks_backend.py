"""agentflow as Django's tasks backend, driven in this process (agentflow.testing.run_to_end)
on the real database: enqueue in transactions, results from the rows, durable options, signals.

The same with real workers and SIGKILL: tests/agentflow/acceptance/test_tasks_backend.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core import checks
from django.db import transaction
from django.test import Client
from django.utils import timezone

from agentflow import durable
from agentflow._tasks_backend import framework
from agentflow.models import StepCheckpoint, WorkflowRun
from agentflow.tasks_backend import DurableTaskBackend
from agentflow.testing import crash_at, run_to_end
from tests.support import durable_tasks, partner, workflows
from tests.support.admin import LIST_URL, detail_url, text

pytestmark = pytest.mark.django_db(transaction=True)

SUCCESSFUL = framework.TaskResultStatus.SUCCESSFUL
FAILED = framework.TaskResultStatus.FAILED
READY = framework.TaskResultStatus.READY
RUNNING = framework.TaskResultStatus.RUNNING


@pytest.fixture
def signals() -> Iterator[list[tuple[str, str, str]]]:
    """Django's task signals as they are sent: (signal, result id, status)."""
    sent: list[tuple[str, str, str]] = []
    receivers = {}
    for name in ("task_enqueued", "task_started", "task_finished"):

        def receiver(sender: Any, task_result: Any, _name: str = name, **kwargs: Any) -> None:
            sent.append((_name, task_result.id, str(task_result.status)))

        receivers[name] = receiver
        getattr(framework, name).connect(receiver, weak=False)
    yield sent
    for name, receiver in receivers.items():
        getattr(framework, name).disconnect(receiver)


def backend() -> Any:
    return framework.task_backends["default"]


def test_backend__is_agentflows__with_exact_flags() -> None:
    found = backend()
    assert isinstance(found, DurableTaskBackend)
    assert (found.supports_defer, found.supports_get_result, found.supports_async_task) == (
        True,
        True,
        True,
    )
    assert found.supports_priority is True


@pytest.mark.parametrize(
    ("task_priority", "run_priority"), [(0, None), (-100, 0), (-50, 2), (1, 5), (50, 7), (100, 9)]
)
def test_enqueue__task_priority__is_the_runs_on_its_scale(
    task_priority: int, run_priority: int | None
) -> None:
    result = durable_tasks.plain.using(priority=task_priority).enqueue([1])

    assert WorkflowRun.objects.get(pk=result.id).priority == run_priority


def test_enqueue__rolled_back__never_runs_and_says_nothing(
    partner_db: Any, signals: list[Any]
) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        result = durable_tasks.charge.enqueue("o-1")
        assert durable_tasks.charge.get_result(result.id).status == READY  # inside: its row
        raise RuntimeError("the caller's transaction fails")

    assert not WorkflowRun.objects.filter(pk=result.id).exists()
    with pytest.raises(framework.TaskResultDoesNotExist):
        durable_tasks.charge.get_result(result.id)
    assert signals == []
    assert partner.effects() == {}


def test_enqueue__committed__runs_once_with_its_key(partner_db: Any, signals: list[Any]) -> None:
    with transaction.atomic():
        result = durable_tasks.charge.enqueue("o-2")
        assert signals == []  # not before the commit
    assert signals == [("task_enqueued", result.id, READY)]
    assert result.status == READY and result.enqueued_at is not None
    assert result.args == ["o-2"] and result.worker_ids == []

    run_to_end(result.id)

    result.refresh()
    key = StepCheckpoint.objects.get(run_id=result.id).idempotency_key
    assert result.status == SUCCESSFUL
    assert result.return_value == {"order": "o-2", "key": key}
    assert result.started_at <= result.last_attempted_at <= result.finished_at
    assert result.attempts == 1 and len(result.worker_ids) == 1 and result.errors == []
    assert partner.effects() == {key: 1}
    assert [(name, status) for name, _, status in signals] == [
        ("task_enqueued", READY),
        ("task_started", RUNNING),
        ("task_finished", SUCCESSFUL),
    ]


def test_task_run__is_an_ordinary_run__the_admin_shows_it(
    partner_db: Any, admin_client: Client
) -> None:
    result = durable_tasks.charge.enqueue("o-admin")
    run_to_end(result.id)

    listed = admin_client.get(LIST_URL)
    page = admin_client.get(detail_url(WorkflowRun.objects.get(pk=result.id)))

    assert listed.status_code == 200 and result.id in text(listed)
    assert page.status_code == 200
    assert "task:tests.support.durable_tasks.charge" in text(page)
    assert StepCheckpoint.objects.get(run_id=result.id).idempotency_key in text(page)


def test_crash_after_the_effect__retry_uses_the_same_key__effect_once(partner_db: Any) -> None:
    result = durable_tasks.charge.enqueue("o-3")

    with crash_at("task:after_effect") as crash:
        run_to_end(result.id)

    assert crash.fired
    result.refresh()
    key = result.return_value["key"]
    assert result.status == SUCCESSFUL and result.attempts == 2
    assert partner.effects() == {key: 1}
    assert [found["attempt"] for found in partner.executions(result.id)] == [1, 2]
    assert partner.requests()[key] == 2  # the same key, twice: the partner made it once


#: Tasks declared with durable options, which Django 6.0's `@task` cannot take.
needs_options = pytest.mark.skipif(
    not durable_tasks.OPTIONS, reason="Django 6.0's @task takes no durable options"
)


@needs_options
def test_task_raises__failed_with_its_exception(signals: list[Any]) -> None:
    result = durable_tasks.explode.enqueue("no such order")

    run_to_end(result.id)

    result.refresh()
    assert result.status == FAILED and result.finished_at is not None
    [error] = result.errors
    assert error.exception_class is ValueError
    assert "no such order" in error.traceback and "Traceback" in error.traceback
    with pytest.raises(ValueError, match="failed"):
        result.return_value  # noqa: B018 - Django's property raises for a failed task
    assert [name for name, _, _ in signals] == ["task_enqueued", "task_started", "task_finished"]
    assert signals[-1][2] == FAILED


def test_run_after__waits_on_a_timer__then_runs() -> None:
    later = timezone.now() + timedelta(hours=1)
    result = durable_tasks.plain.using(run_after=later).enqueue([1, 2, 3])

    snapshot = run_to_end(result.id, retries=False)
    assert snapshot.waiting_for == "timer"
    assert durable_tasks.plain.get_result(result.id).status == READY

    run_to_end(result.id)
    result.refresh()
    assert (result.status, result.return_value) == (SUCCESSFUL, 6)


def test_async_task__runs_to_its_end() -> None:
    result = durable_tasks.later.enqueue("quiet")
    run_to_end(result.id)
    assert durable_tasks.later.get_result(result.id).return_value == "QUIET"


@needs_options
def test_replay_task__durable_calls_inside__each_checkpointed(partner_db: Any) -> None:
    result = durable_tasks.onboard.enqueue("ada")

    waiting = run_to_end(result.id)
    assert waiting.waiting_for == "signal"
    assert durable_tasks.onboard.get_result(result.id).status == RUNNING
    durable.signal(result.id, "confirmed", {"by": "ada"}, signal_id="confirm-1")
    run_to_end(result.id)

    result.refresh()
    welcome = StepCheckpoint.objects.get(run_id=result.id, name="welcome").idempotency_key
    assert result.return_value == {"user": "ada", "welcome": welcome, "confirmed": {"by": "ada"}}
    assert partner.effects() == {welcome: 1}


def test_get_result__unknown_or_not_a_task__does_not_exist() -> None:
    other = durable.start(workflows.chain.name)  # a run, but no task's
    for unknown in ("nope", "", "x" * 65, "a\x00b", other, 42):
        with pytest.raises(framework.TaskResultDoesNotExist):
            backend().get_result(unknown)


@needs_options
def test_durable_options__refused_at_definition_and_by_check() -> None:
    with pytest.raises(framework.InvalidTask, match="kind is 'effect' or 'read'"):
        _decorate(kind="llm")
    with pytest.raises(framework.InvalidTask, match="takes its context"):
        _decorate(replay=True)

    refused = DurableTaskBackend("odd", {"QUEUES": ["default", "emails"]})
    assert [m.id for m in refused.check() if m.level >= checks.ERROR] == ["agentflow.E042"]
    assert list(backend().check()) == []


def _decorate(**options: Any) -> Any:
    return durable_tasks.task(**options)(_module_level)


def _module_level() -> None:
    """A module-level function for `_decorate` (Django refuses others)."""
