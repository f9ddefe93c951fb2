"""A batch of read-only calls running at once is a typed span on its run (`current_seq` its
first position, `batch_last` its last): every reader and every fenced write uses the field;
`current_step` only says it in words. Runs in flight when the field came are given it from
those words, once, by the migration."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps
from django.db import connection

from agentflow import _store as store
from agentflow import durable
from agentflow._base.states import RunStatus, StepStatus
from agentflow._core.registry import NEXT_CALL
from agentflow._engine import runtime
from agentflow.models import StepCheckpoint, WorkflowRun
from tests.support import workflows

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]


def _say(run_id: str, words: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {WorkflowRun._meta.db_table} SET current_step = %s WHERE id = %s",
            [words, run_id],
        )


def test_a_batch__is_its_span_in_fields__the_words_are_never_read_back() -> None:
    run_id = durable.start(workflows.agent.name)
    runtime.run_step(run_id, 1)  # the model's turn asks for both lookups
    runtime.run_step(run_id, 2)  # begins the batch 2-3, and runs its first

    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.current_seq, run.batch_last) == (2, 3)
    assert run.current_step == "(calls 2-3 at once)"
    _say(run_id, "anything at all")  # what people read: no reader parses it

    runtime.run_step(run_id, 3)  # the last member: recorded, and the batch joins

    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.current_seq, run.current_step) == (RunStatus.RUNNING, 4, NEXT_CALL)
    assert run.batch_last is None
    done = StepCheckpoint.objects.filter(run_id=run_id, status=StepStatus.COMPLETED)
    assert sorted(done.values_list("seq", flat=True)) == [1, 2, 3]


def test_a_message_past_the_span__runs_nothing() -> None:
    run_id = durable.start(workflows.agent.name)
    runtime.run_step(run_id, 1)
    runtime.run_step(run_id, 2)
    WorkflowRun.objects.filter(pk=run_id).update(batch_last=2)  # a span that no longer has 3

    runtime.run_step(run_id, 3)

    assert not StepCheckpoint.objects.filter(run_id=run_id, seq=3).exists()


def test_the_migration__gives_runs_in_flight_their_span_from_the_words() -> None:
    migration = importlib.import_module("agentflow.migrations.0022_run_batch_last")
    in_batch = WorkflowRun.objects.create(
        workflow="w",
        version=1,
        status=RunStatus.FAILED,
        current_step="(calls 5-7 at once)",
        current_seq=5,
    )
    between = WorkflowRun.objects.create(
        workflow="w", version=1, status=RunStatus.FAILED, current_step=NEXT_CALL, current_seq=4
    )
    step = WorkflowRun.objects.create(
        workflow="w", version=1, status=RunStatus.FAILED, current_step="(calls", current_seq=1
    )

    migration.fill_batch_last(apps, connection.schema_editor())

    found = dict(WorkflowRun.objects.values_list("id", "batch_last"))
    assert found == {in_batch.id: 7, between.id: None, step.id: None}


def test_a_members_writes__are_fenced_on_the_typed_span() -> None:
    run_id = durable.start(workflows.agent.name)
    runtime.run_step(run_id, 1)
    runtime.run_step(run_id, 2)
    assert store.batch_keep_alive(run_id, 2, 3)
    member = store.state_load(run_id, 3)
    assert member is not None and member.batch == (2, 3)
    WorkflowRun.objects.filter(pk=run_id).update(batch_last=4)  # another batch from 2 now

    assert not store.batch_keep_alive(run_id, 2, 3)
    assert store.batch_keep_alive(run_id, 2, 4)
    _say(run_id, "(calls 2-3 at once)")  # the old words back: still not this batch
    assert not store.batch_keep_alive(run_id, 2, 3)
