"""A member of a parallel read-only batch that gets no turn at a limited partner (SPEC 3.10)
waits, spending no attempt, while its sibling is recorded; the batch joins once it is too.
Real worker processes, the partner limit held in Postgres (`tests/support/limited_agent.py`)."""

from __future__ import annotations

import json

import pytest

from agentflow import durable
from agentflow.models import RunEvent, StepCheckpoint
from tests.support import limited_agent
from tests.support.engine import stopped
from tests.support.processes import Workers

pytestmark = pytest.mark.django_db(transaction=True)

#: A turn every 5 s: the member that asks second waits for the next, however late it asks.
LIMITS = {limited_agent.PARTNER: {"rate": "12/m"}}


def test_a_batch_member_waits_for_its_turn__no_attempt_spent__the_batch_joins(
    workers: Workers,
) -> None:
    worker = workers.start(
        AGENTFLOW_WORKFLOW_MODULES="tests.support.workflows,tests.support.limited_agent",
        AGENTFLOW_PARTNER_LIMITS=json.dumps(LIMITS),
    )
    run_id = durable.start(limited_agent.agent.name)

    run = stopped(run_id, timeout=90, worker=worker)

    assert run.status == durable.RunStatus.COMPLETED, run.error
    steps = {s.name: s for s in StepCheckpoint.objects.filter(run_id=run_id)}
    price, stock = steps["lookup_price"], steps["lookup_stock"]
    assert stock.seq == price.seq + 1  # begun at once, at the model's positions
    assert price.status == stock.status == "COMPLETED"
    assert price.attempts == stock.attempts == 1  # the wait was no attempt
    held = RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.HELD)
    assert {e.seq for e in held} & {price.seq, stock.seq}
    assert all(e.detail.startswith(f"waiting for {limited_agent.PARTNER}: ") for e in held)
    assert run.output == "A kettle is $12.00; 3 in stock."
