"""Priorities and concurrency keys with real workers, on Redis and on RabbitMQ
(docs/workflows.md, "Priorities" and "Concurrency keys").

Order is read from the partner stand-in's execution log (each step body records itself first),
never from timings: a run of higher priority runs while the backlog it passed is still queued;
two runs with one key never run at once, even across a worker killed while the first holds
the key; a key with one run does not wait behind another key's many.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentflow import durable
from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus
from agentflow.models import WorkflowRun
from agentflow.testing.waiting import wait_for
from tests.support import partner, workflows
from tests.support.processes import Workers

BROKERS = ("redis", "rabbitmq")
#: Runs of the lowest priority queued before the one of the highest.
BACKLOG = 24


def wait_all_finished(run_ids: list[str], *, timeout: float = 120.0) -> None:
    def done() -> bool:
        return not WorkflowRun.objects.filter(
            pk__in=run_ids, status__in=ACTIVE_RUN_STATUSES
        ).exists()

    wait_for(done, timeout=timeout, interval=0.05, what=f"{len(run_ids)} runs to finish")


def order_of(run_ids: list[str]) -> list[str]:
    """The runs in the order their first step ran, as the partner saw it."""
    seen: list[str] = []
    for row in partner.executions():
        if row["run_id"] in run_ids and row["run_id"] not in seen:
            seen.append(row["run_id"])
    return seen


def wait_execution(run_id: str, step: str) -> dict[str, Any]:
    def row() -> dict[str, Any] | None:
        return next((r for r in partner.executions(run_id) if r["step"] == step), None)

    return wait_for(row, timeout=90, interval=0.02, what=f"{step} of {run_id} to start")


@pytest.mark.parametrize("infra", BROKERS, indirect=True)
def test_priority__high_run_passes_a_queued_backlog_of_low_ones(
    workers: Workers, infra: str
) -> None:
    backlog = [
        durable.start(workflows.one_read.name, input={"n": n}, priority=0) for n in range(BACKLOG)
    ]
    urgent = durable.start(workflows.one_read.name, input={"n": "urgent"}, priority=9)
    assert WorkflowRun.objects.get(pk=urgent).priority == 9
    workers.start(concurrency=1)  # every message is queued before the first is taken
    wait_all_finished([*backlog, urgent])

    order = order_of([*backlog, urgent])
    assert len(order) == BACKLOG + 1
    # Taken first, or nearly (a message in flight as the worker starts), while the backlog is
    # still queued: without priorities it would run last.
    assert order.index(urgent) < BACKLOG // 2, order.index(urgent)


@pytest.mark.parametrize("infra", BROKERS, indirect=True)
def test_concurrency_key__worker_killed_while_the_first_holds_it__second_waits_then_runs(
    workers: Workers, infra: str
) -> None:
    first = durable.start(workflows.keyed.name, input={"key": "BOOKING-1"})
    second = durable.start(workflows.keyed.name, input={"key": "BOOKING-1"})
    waiting = durable.snapshot(second)
    assert waiting is not None and waiting.status == RunStatus.WAITING
    assert "same concurrency key" in waiting.held
    stored = WorkflowRun.objects.get(pk=first).concurrency_key
    assert stored and "BOOKING-1" not in stored and len(stored) == 64  # an HMAC, not the key

    worker = workers.start(concurrency=2, AGENTFLOW_LEASE_SECONDS="2")
    wait_execution(first, "hold")
    worker.kill()  # SIGKILL, parent and children
    # Killed while the first holds the key: the second has not run and still waits.
    assert partner.executions(second) == []
    assert WorkflowRun.objects.get(pk=second).status == RunStatus.WAITING

    partner.release(first)
    partner.release(second)
    workers.start(concurrency=2, beat=True, AGENTFLOW_LEASE_SECONDS="2")
    wait_all_finished([first, second])

    assert WorkflowRun.objects.get(pk=first).status == RunStatus.COMPLETED
    assert WorkflowRun.objects.get(pk=second).status == RunStatus.COMPLETED
    rows = partner.executions()
    last_of_first = max(i for i, r in enumerate(rows) if r["run_id"] == first)
    first_of_second = min(i for i, r in enumerate(rows) if r["run_id"] == second)
    assert last_of_first < first_of_second  # never both at once


@pytest.mark.parametrize("infra", BROKERS, indirect=True)
def test_fair_share__a_key_with_one_run_does_not_wait_for_another_keys_many(
    workers: Workers, infra: str
) -> None:
    many = [durable.start(workflows.keyed_quick.name, input={"key": "A", "n": n}) for n in range(8)]
    one = durable.start(workflows.keyed_quick.name, input={"key": "B"})
    assert WorkflowRun.objects.filter(pk__in=many, status=RunStatus.WAITING).count() == 7
    workers.start(concurrency=1)
    wait_all_finished([*many, one])

    order = order_of([*many, one])
    assert order[: len(many) + 1] == order  # every run ran
    # A's runs go one at a time, each admitted behind what is already queued: B's one run
    # is taken after at most A's first two, not after all eight.
    assert order.index(one) <= 2, order
    assert [run for run in order if run != one] == many  # A's in arrival order
