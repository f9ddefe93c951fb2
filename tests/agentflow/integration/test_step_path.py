"""The step path's round trips against real Postgres, in this process: a fresh read step whose
message carries the run's input is one statement, an effect step two (the claim folded into the
load, then the fenced completion), and a read run from its message never records anything the
run was not waiting for.

Statements are counted at the cursors the engine uses (the store's psycopg cursor and Django's),
not timed: the speed is `bench`'s."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from agentflow import dispatch, durable, pooler, registry, runtime
from agentflow.models import StepCheckpoint, WorkflowRun
from agentflow.states import RunStatus, StepStatus
from tests.support import partner, workflows

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]


def _echo(ctx: durable.StepContext) -> dict[str, Any]:
    partner.record_execution(ctx.run_id, ctx.seq, ctx.step, ctx.attempt)
    return {"input": ctx.input}


def _unsteady(ctx: durable.StepContext) -> dict[str, Any]:
    partner.record_execution(ctx.run_id, ctx.seq, ctx.step, ctx.attempt)
    if ctx.attempt == 1:
        raise durable.RetryableStepError("partner said 503")
    return {"input": ctx.input}


#: read (echoes the input) -> effect -> read that fails its first attempt.
echo = durable.Workflow("step_path_echo", version=1)
echo.step("look", kind="read")(_echo)
echo.step("charge", kind="effect")(workflows.effect)
echo.step("again", kind="read", retry=durable.RetryPolicy(base_seconds=60.0))(_unsteady)


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every statement this process sends to Postgres while the test runs."""
    sent: list[str] = []
    original = pooler.Cursor.execute

    def counted(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        sent.append(str(query))
        return original(self, query, params, **kwargs)

    def django(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(sql)
        return execute(sql, params, many, context)

    monkeypatch.setattr(pooler.Cursor, "execute", counted)
    with connection.execute_wrapper(django):
        yield sent


def _hint(run_id: str, step: str) -> dispatch.Fresh | None:
    """The hint the publisher sends when it moves `run_id` onto `step`."""
    run = WorkflowRun.objects.get(pk=run_id)
    return dispatch.fresh_hint(registry.lookup(run.workflow, run.version), step, input=run.input)  # type: ignore[arg-type]


def _checkpoint(run_id: str, seq: int) -> StepCheckpoint:
    return StepCheckpoint.objects.get(run_id=run_id, seq=seq)


def test_step_path__a_fresh_read_is_one_statement_and_an_effect_two(
    statements: list[str],
) -> None:
    run_id = durable.start(workflows.ten.name)
    read_hint, effect_hint = _hint(run_id, "s0"), _hint(run_id, "s1")
    statements.clear()

    runtime.run_step(run_id, 1, fresh=read_hint)
    read_statements = len(statements)
    runtime.run_step(run_id, 2, fresh=effect_hint)

    assert read_statements == 1, statements
    assert len(statements) == 3, statements
    assert [_checkpoint(run_id, seq).status for seq in (1, 2)] == [StepStatus.COMPLETED] * 2
    assert WorkflowRun.objects.get(pk=run_id).current_seq == 3
    assert partner.effects() == {f"{run_id}_step_2": 1}


def test_step_path__the_first_read_of_a_run_gets_the_input_from_its_message(
    statements: list[str],
) -> None:
    run_id = durable.start(echo.name, input={"booking": "B-1", "amount": 12.5})
    hint = _hint(run_id, "look")
    statements.clear()

    runtime.run_step(run_id, 1, fresh=hint)

    assert len(statements) == 1, statements
    assert _checkpoint(run_id, 1).output == {"input": {"booking": "B-1", "amount": 12.5}}


def test_step_path__a_message_with_another_input__records_only_the_runs_own(
    statements: list[str],
) -> None:
    """The fast write is fenced on the input the message carried: a message that lies about it
    (a forged or corrupted one) has its read run again with the run's own input."""
    run_id = durable.start(echo.name, input={"booking": "B-1"})
    forged = dispatch.fresh_hint(echo, "look", input={"booking": "B-666"})

    runtime.run_step(run_id, 1, fresh=forged)

    assert _checkpoint(run_id, 1).output == {"input": {"booking": "B-1"}}
    assert [e["step"] for e in partner.executions(run_id)] == ["look", "look"]


def test_step_path__a_duplicate_fresh_read__records_nothing_more() -> None:
    run_id = durable.start(echo.name, input={"booking": "B-1"})
    hint = _hint(run_id, "look")

    runtime.run_step(run_id, 1, fresh=hint)
    runtime.run_step(run_id, 1, fresh=hint)  # the same message again

    checkpoint = _checkpoint(run_id, 1)
    assert (checkpoint.status, checkpoint.attempts) == (StepStatus.COMPLETED, 1)
    assert WorkflowRun.objects.get(pk=run_id).current_seq == 2


def test_step_path__a_read_cancelled_under_its_message__records_nothing() -> None:
    run_id = durable.start(echo.name, input={"booking": "B-1"})
    hint = _hint(run_id, "look")
    durable.cancel(run_id, actor="ops", reason="customer withdrew")

    runtime.run_step(run_id, 1, fresh=hint)

    assert not StepCheckpoint.objects.filter(run_id=run_id, name="look").exists()
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.CANCELLED


def test_step_path__a_fresh_read_that_fails__is_recorded_once_not_run_twice() -> None:
    """A failure of the read run from its message is that attempt's: the run is loaded to
    record it, and the step is not run a second time for the same attempt."""
    run_id = durable.start(echo.name, input={"booking": "B-1"})
    runtime.run_step(run_id, 1, fresh=_hint(run_id, "look"))
    runtime.run_step(run_id, 2, fresh=_hint(run_id, "charge"))

    runtime.run_step(run_id, 3, fresh=_hint(run_id, "again"))

    checkpoint = _checkpoint(run_id, 3)
    assert (checkpoint.status, checkpoint.attempts, checkpoint.retryable) == (
        StepStatus.FAILED,
        1,
        True,
    )
    assert [e["step"] for e in partner.executions(run_id)] == ["look", "charge", "again"]
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.WAITING
