"""The step path's round trips against real Postgres, in this process: a read step is its load
and one completing statement, an effect step two (the claim folded into the load, then the
fenced completion); and a cancelled run's next read step does no work
(docs/protocol.md, "One step, in order", step 2).

Statements are counted at the cursors the engine uses (the store's psycopg cursor and Django's),
not timed: the speed is `bench`'s."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from agentflow import durable
from agentflow._base.states import RunStatus, StepStatus
from agentflow._core import dispatch, pooler, registry
from agentflow._engine import runtime
from agentflow.models import StepCheckpoint, WorkflowRun
from tests.support import partner, workflows
from tests.support.engine import step_messages
from tests.support.processes import RedisServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]


def _echo(ctx: durable.StepContext) -> dict[str, Any]:
    partner.record_execution(ctx.run_id, ctx.seq, ctx.step, ctx.attempt)
    return {"input": ctx.input}


#: effect -> read that records each execution.
echo = durable.Workflow("step_path_echo", version=1)
echo.step("charge", kind="effect")(workflows.effect)
echo.step("look", kind="read")(_echo)


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
    return dispatch.fresh_hint(registry.lookup(run.workflow, run.version), step)  # type: ignore[arg-type]


def _checkpoint(run_id: str, seq: int) -> StepCheckpoint:
    return StepCheckpoint.objects.get(run_id=run_id, seq=seq)


def test_step_path__a_read_is_its_load_and_one_write__an_effect_two(
    statements: list[str],
) -> None:
    run_id = durable.start(workflows.ten.name)
    read_hint, effect_hint = _hint(run_id, "s0"), _hint(run_id, "s1")
    statements.clear()

    runtime.run_step(run_id, 1, fresh=read_hint)
    read_statements = len(statements)
    runtime.run_step(run_id, 2, fresh=effect_hint)

    assert read_hint is None  # a read step takes no claim: nothing to fold into its load
    assert read_statements == 2, statements
    assert len(statements) == 4, statements
    assert [_checkpoint(run_id, seq).status for seq in (1, 2)] == [StepStatus.COMPLETED] * 2
    assert WorkflowRun.objects.get(pk=run_id).current_seq == 3
    assert partner.effects() == {f"{run_id}_step_2": 1}


def test_step_path__cancelled_after_the_next_read_was_published__it_is_never_run(
    engine: RedisServer,
) -> None:
    """The read's message was published by the effect's completion, before the operator's
    cancel: the worker that takes it must find the cancel before running anything (a read run
    straight from its message did not)."""
    run_id = durable.start(echo.name, input={"booking": "B-1"})
    [(args, kwargs)] = step_messages(engine)
    engine.client().flushall()  # this test plays the worker
    runtime.run_step(*args, **kwargs)
    [(args, kwargs)] = step_messages(engine)
    engine.client().flushall()
    durable.cancel(run_id, actor="ops", reason="customer withdrew")

    runtime.run_step(*args, **kwargs)  # the message the engine published for "look"

    assert [e["step"] for e in partner.executions(run_id)] == ["charge"]
    assert not StepCheckpoint.objects.filter(run_id=run_id, name="look").exists()
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.CANCELLED
