"""A member of a parallel read-only batch that gets no turn at a limited partner
(docs/partner-limits.md, "What happens") waits, spending no attempt, while its sibling is recorded;
the batch joins once it is too. Real worker processes, the partner limit held in Postgres
(`tests/support/limited_agent.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.contrib.admin.utils import quote
from django.test import Client

from agentflow import durable
from agentflow.models import RunEvent, StepCheckpoint
from agentflow.testing.waiting import wait_for
from tests.support import limited_agent
from tests.support.engine import stopped
from tests.support.processes import Workers, log_has

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


def test_a_waiting_first_member__holds_the_runs_reason__its_wake_up_runs_no_sibling_twice(
    workers: Workers, tmp_path: Path, admin_client: Client
) -> None:
    """The batch's first member waits for a partner's turn while its sibling, a slow read,
    runs: the run shows the member's reason as a step's wait does (snapshot, run page), with
    the sibling still running; once the member goes, the reason is gone. Its wake-up message
    comes at the batch's first position, which is no doorbell: the slow read is never
    published again, and runs once."""
    count, gate = tmp_path / "shelves-calls", tmp_path / "shelves-gate"
    worker = workers.start(
        concurrency=2,
        AGENTFLOW_WORKFLOW_MODULES="tests.support.workflows,tests.support.limited_agent",
        AGENTFLOW_PARTNER_LIMITS=json.dumps({limited_agent.PARTNER: {"rate": "6/m"}}),
        TEST_BATCH_COUNT=str(count),
        TEST_BATCH_GATE=str(gate),
    )
    run_id = durable.start(limited_agent.slow_agent.name)
    prefix = f"waiting for {limited_agent.PARTNER}: "

    held = wait_for(
        lambda: (s := durable.snapshot(run_id)).held.startswith(prefix) and s, timeout=90
    )
    assert held.status == durable.RunStatus.RUNNING  # its sibling runs
    assert held.current_step.endswith("at once)"), held.current_step
    page = admin_client.get(
        f"/admin/agentflow/workflowrun/{quote(run_id)}/change/"
    ).content.decode()
    assert held.held in page
    price = wait_for(
        lambda: StepCheckpoint.objects.filter(
            run_id=run_id, name="lookup_price", status="COMPLETED"
        ).first(),
        timeout=90,
    )
    after = durable.snapshot(run_id)
    assert after.held == "" and after.current_step == held.current_step  # gone; still batched
    assert not log_has(worker, "is published again")  # its wake-up rang no doorbell
    gate.touch()

    run = stopped(run_id, timeout=90, worker=worker)

    assert run.status == durable.RunStatus.COMPLETED, run.error
    assert price.attempts == 1
    shelves = StepCheckpoint.objects.get(run_id=run_id, name="count_shelves")
    assert shelves.seq == price.seq + 1
    assert count.read_text().splitlines() == [shelves.idempotency_key]  # ran once
