"""Parallel read-only tool calls under real workers (issue 28): the refund agent's second turn
asks for `fetch_booking` and `check_cancellation_policy` at once; they run as two step tasks at
the same time (their recorded start and end times overlap on the run's timeline), their
results enter the conversation in the model's order, and a SIGKILL of the whole worker after
the first is recorded re-runs only the second.

Both tools read the booking from the airline (the sandbox); when the model is asked turn 2 the
test arms a barrier on that endpoint, which holds each read at the airline until the other is
there too (or holds one until the test lets it go): concurrency is made certain, never waited
for with a latency a busy machine can outlast. A read held longer than the worker's lease is
still running, so the sweeper must leave its batch alone (its doorbell would run it again)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from agentflow import durable
from agentflow.admin import timeline
from agentflow.models import RunEvent, StepCheckpoint, SweeperHeartbeat, WorkflowRun
from agentflow.testing.waiting import wait_for
from refunds.agent.planner import plan_refund
from tests.support.agent_workers import AgentWorker
from tests.support.llm_server import LLMServer, SeenRequest, planned_by
from tests.support.refunds import finished, partner_effects, submit
from tests.support.sandbox import SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)

READS = ("fetch_booking", "check_cancellation_policy")
#: Hold the first booking read at the airline until a second would join it, which none does
#: (the fault fires once): it stays there until the test clears the faults.
HOLD_ONE = {"barrier": 2, "count": 1, "barrier_timeout_ms": 120_000}


def arming_on_turn_2(sandbox: SandboxProcess, **fault: Any) -> Callable[[SeenRequest], Any]:
    """The refund planner, arming `fault` on the airline's booking reads just before it
    answers turn 2 (earlier steps read the booking too)."""
    planner = planned_by(plan_refund)
    armed: list[bool] = []

    def answer(seen: SeenRequest) -> Any:
        if seen.turn == 2 and not armed:
            sandbox.set_fault(endpoint="airline.booking", **fault)
            armed.append(True)
        return planner(seen)

    return answer


def reads(run_id: str) -> dict[str, StepCheckpoint]:
    rows = StepCheckpoint.objects.filter(run_id=run_id, name__in=READS)
    return {row.name: row for row in rows}


def one_recorded(run_id: str) -> str | None:
    """The name of the batch's one recorded read, while exactly one is."""
    done = [
        name for name, row in reads(run_id).items() if row.status == durable.StepStatus.COMPLETED
    ]
    return done[0] if len(done) == 1 else None


def ran(logs: str, run_id: str, name: str) -> int:
    """How many times a worker began running `name` as a member of a batch."""
    return sum(
        1 for line in logs.splitlines() if run_id in line and f" {name}: runs at once" in line
    )


def test_two_reads_in_one_turn__run_at_once__results_in_the_models_order(
    agent_worker: AgentWorker, llm_server: LLMServer, clean_sandbox: SandboxProcess
) -> None:
    # Each read is held at the airline until the other arrives: they overlap, however late a
    # pool process picks up the second (a broken engine running them one after the other
    # waits out the deadline each and fails the overlap assertions below).
    llm_server.script(
        arming_on_turn_2(clean_sandbox, barrier=2, count=2, barrier_timeout_ms=30_000)
    )
    worker = agent_worker()
    run_id = submit("AGR001")

    run = finished(run_id, worker, timeout=90)

    assert run.status == durable.RunStatus.COMPLETED, run.error
    found = reads(run_id)
    booking, policy = found["fetch_booking"], found["check_cancellation_policy"]
    assert policy.seq == booking.seq + 1  # the model's order, at consecutive positions
    # Each began before the other was recorded: they ran at the same time.
    assert booking.started_at < policy.finished_at and policy.started_at < booking.finished_at
    logs = worker.log_tail(5000)
    assert ran(logs, run_id, "fetch_booking") == ran(logs, run_id, "check_cancellation_policy") == 1
    # The run's timeline draws the two lanes overlapping.
    row = WorkflowRun.objects.get(pk=run_id)
    drawn = timeline.build(
        row,
        StepCheckpoint.objects.filter(run_id=run_id),
        RunEvent.objects.filter(run_id=run_id),
        now=timezone.now(),
    )
    lanes = {lane.name: lane for lane in drawn.lanes}
    [a], [b] = lanes["fetch_booking"].attempts, lanes["check_cancellation_policy"].attempts
    assert a.start < b.end and b.start < a.end
    # Turn 3 was shown both results, in the order the model asked for them.
    [turn_3] = [seen for seen in llm_server.requests if seen.turn == 3]
    results = [m["tool_call_id"] for m in turn_3.messages if m["role"] == "tool"]
    asked = [m for m in turn_3.messages if m["role"] == "assistant"][1]["tool_calls"]
    assert results[-2:] == [call["id"] for call in asked]
    ledger = partner_effects(clean_sandbox, run_id)
    assert len(ledger["payments"]) == 1 and ledger["refunds"] == []


def test_sigkill_after_the_first_read_is_recorded__only_the_second_runs_again(
    agent_worker: AgentWorker, llm_server: LLMServer, clean_sandbox: SandboxProcess
) -> None:
    # One of the two reads (whichever reaches the airline first) is held there until the test
    # lets it go, so the other is recorded first while it is still running.
    llm_server.script(arming_on_turn_2(clean_sandbox, **HOLD_ONE))
    first = agent_worker()
    run_id = submit("AGR002")

    recorded = wait_for(
        lambda: one_recorded(run_id), timeout=60, interval=0.02, what="the first read recorded"
    )
    other = next(name for name in READS if name != recorded)
    first.kill()  # the whole worker, with the other read still at the airline
    assert reads(run_id).get(other) is None  # not recorded when the worker died
    clean_sandbox.clear_faults()  # the held read answers a dead worker
    second = agent_worker()

    run = finished(run_id, second, timeout=90)

    assert run.status == durable.RunStatus.COMPLETED, run.error
    before, after = first.log_tail(5000), second.log_tail(5000)
    assert ran(before, run_id, recorded) == 1 and ran(after, run_id, recorded) == 0
    assert ran(before, run_id, other) == 1 and ran(after, run_id, other) >= 1
    assert reads(run_id)[recorded].attempts == 1
    ledger = partner_effects(clean_sandbox, run_id)
    assert len(ledger["payments"]) == 1 and ledger["refunds"] == []


def test_a_read_held_past_the_lease__is_left_alone_by_the_sweeper_and_runs_once(
    agent_worker: AgentWorker, llm_server: LLMServer, clean_sandbox: SandboxProcess
) -> None:
    llm_server.script(arming_on_turn_2(clean_sandbox, **HOLD_ONE))
    worker = agent_worker()
    run_id = submit("AGR003")
    recorded = wait_for(
        lambda: one_recorded(run_id), timeout=60, interval=0.02, what="the first read recorded"
    )
    held = next(name for name in READS if name != recorded)
    # The batch began before its recorded member started: without the held read keeping it
    # alive, its wake-up time passed a lease after that. Wait for a sweep that began after it.
    lease = float(worker.env["AGENTFLOW_LEASE_SECONDS"])
    overdue_from = reads(run_id)[recorded].started_at + timedelta(seconds=lease)
    after = wait_for(
        lambda: swept_after(overdue_from), timeout=60, interval=0.1, what="a sweep past it"
    )
    wait_for(lambda: swept_after(after), timeout=60, interval=0.1, what="the next sweep")
    clean_sandbox.clear_faults()  # the held read answers

    run = finished(run_id, worker, timeout=90)

    assert run.status == durable.RunStatus.COMPLETED, run.error
    found = reads(run_id)
    first = min(row.seq for row in found.values())
    rung = RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.SWEEP_REQUEUE, seq=first)
    assert not rung.exists()  # the batch was never taken for stalled
    logs = worker.log_tail(5000)
    assert ran(logs, run_id, held) == ran(logs, run_id, recorded) == 1
    assert found[held].attempts == found[recorded].attempts == 1
    assert found[held].started_at < found[recorded].finished_at  # the run that was held


def swept_after(moment: datetime) -> datetime | None:
    """When the sweeper last finished a pass, if that was after `moment`."""
    beat = SweeperHeartbeat.objects.first()
    return beat.swept_at if beat is not None and beat.swept_at > moment else None
