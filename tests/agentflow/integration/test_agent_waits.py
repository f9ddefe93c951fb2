"""Timers, signals and approvals in agent runs (docs/workflows.md, "Timers, signals and approvals"),
in this process against real Postgres: a wait is a durable call at its position, replayed from its
checkpoint; a tool that requires approval waits for a decision on that exact call; a fork reuses a
decision only for the byte-identical call."""

from __future__ import annotations

import pytest
from django.db.models import F

from agentflow import _store as store
from agentflow import durable
from agentflow._base.states import RunStatus, StepKind
from agentflow._engine import runtime
from agentflow._store import aging
from agentflow.models import RunEvent, RunSignal, RunWait
from agentflow.testing import capture_messages, run_to_end
from tests.support import partner, workflows

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]

CHARGE = 2  # the cashier's charge: after its first model turn


def waiting(run_id: str) -> durable.RunSnapshot:
    found = run_to_end(run_id, retries=False)
    assert found.status == RunStatus.WAITING, found.error
    return found


def effects_of(run_id: str) -> dict[str, int]:
    return {k: n for k, n in partner.effects().items() if k.startswith(f"{run_id}_")}


# --- approvals of tool calls --------------------------------------------------------------------
def test_tool_approval__waits_for_the_exact_call_then_runs_once_approved() -> None:
    run_id = durable.start(workflows.cashier.name)

    found = waiting(run_id)

    assert found.waiting_for == "approval"
    assert found.pending_approval is not None
    assert found.pending_approval["call"] == "charge"
    assert found.pending_approval["arguments"] == {"amount_cents": 4500}
    assert found.pending_approval["digest"] == store.call_digest("charge", {"amount_cents": 4500})
    assert effects_of(run_id) == {}

    durable.approve(run_id, actor="alice", reason="fee confirmed")
    done = run_to_end(run_id)

    assert done.status == RunStatus.COMPLETED, done.error
    assert effects_of(run_id) == {durable.idempotency_key(run_id, CHARGE): 1}
    assert done.steps[CHARGE - 1].output["ok"] is True
    assert partner.execution_counts(run_id)[(run_id, CHARGE, "charge")] == 1


def test_tool_approval__rejected__the_tool_does_not_run_and_the_model_reads_why() -> None:
    run_id = durable.start(workflows.cashier.name)
    waiting(run_id)

    durable.reject(run_id, actor="bob", reason="fee waived")
    done = run_to_end(run_id)

    assert done.status == RunStatus.COMPLETED, done.error
    charge = done.steps[CHARGE - 1]
    assert charge.kind == StepKind.READ
    assert charge.output == {
        "ok": False,
        "result": {"rejected": True, "reason": "fee waived", "timed_out": False, "reply": ""},
    }
    assert '"rejected":true' in done.output
    assert effects_of(run_id) == {}


def test_tool_approval__timeout__the_model_reads_a_timed_out_rejection() -> None:
    run_id = durable.start(workflows.cashier.name)
    waiting(run_id)

    aging.runs_age([run_id], seconds=48 * 3600 + 1)
    done = run_to_end(run_id)

    assert done.status == RunStatus.COMPLETED, done.error
    assert done.steps[CHARGE - 1].output["result"]["timed_out"] is True
    assert effects_of(run_id) == {}


def test_tool_approval__predicate_false__the_call_runs_at_once() -> None:
    run_id = durable.start(workflows.cashier.name, input={"amount": 900})

    done = run_to_end(run_id)

    assert done.status == RunStatus.COMPLETED
    assert not RunWait.objects.filter(run_id=run_id).exists()
    assert effects_of(run_id) == {durable.idempotency_key(run_id, CHARGE): 1}


def approved_then_parked(run_id: str) -> None:
    """Approve the charge, let it run, then park the run before its next model turn (as if
    that turn had diverged)."""
    waiting(run_id)
    durable.approve(run_id, actor="alice", reason="fee confirmed")
    with capture_messages():
        runtime.run_step(run_id, CHARGE)
    assert effects_of(run_id) == {durable.idempotency_key(run_id, CHARGE): 1}
    assert store.run_park(run_id, CHARGE + 1, "parked for the test", fence=None)


def test_fork__the_byte_identical_call_reuses_the_approved_charge_and_waits_for_nothing() -> None:
    run_id = durable.start(workflows.cashier.name)
    approved_then_parked(run_id)

    durable.fork(run_id, position=1, actor="ops", reason="try again")
    done = run_to_end(run_id)

    assert done.status == RunStatus.COMPLETED, done.error
    assert effects_of(run_id) == {durable.idempotency_key(run_id, CHARGE): 1}  # never again
    assert not RunWait.objects.filter(run_id=run_id, branch=1).exists()


def test_fork__approved_but_not_yet_run__the_byte_identical_call_reuses_the_decision() -> None:
    run_id = durable.start(workflows.cashier.name)
    waiting(run_id)
    durable.approve(run_id, actor="alice", reason="fee confirmed")
    assert store.run_park(run_id, CHARGE, "parked before the charge ran", fence=None)

    durable.fork(run_id, position=1, actor="ops", reason="try again")
    done = run_to_end(run_id)

    assert done.status == RunStatus.COMPLETED, done.error  # no second wait
    assert effects_of(run_id) == {durable.idempotency_key(run_id, CHARGE, branch=1): 1}
    reused = RunWait.objects.get(run_id=run_id, branch=1, seq=CHARGE)
    assert (reused.actor, reused.outcome["approved"]) == ("alice", True)
    event = RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.OPERATOR_APPROVE).last()
    assert event is not None and event.data["reused_from"] == {"branch": 0, "seq": CHARGE}


def test_fork__a_different_amount_needs_a_fresh_decision() -> None:
    run_id = durable.start(workflows.cashier.name)
    approved_then_parked(run_id)
    partner.release(workflows.discount(run_id))  # the new branch's model charges 3000

    durable.fork(run_id, position=1, actor="ops", reason="discount applies")
    found = waiting(run_id)

    assert found.waiting_for == "approval"
    assert found.pending_approval is not None
    assert found.pending_approval["arguments"] == {"amount_cents": 3000}
    with pytest.raises(durable.ActionRefused):
        durable.fork(run_id, position=1, actor="ops", reason="racing the approval")
    durable.approve(run_id, actor="alice", reason="discounted fee")
    done = run_to_end(run_id)
    assert done.status == RunStatus.COMPLETED, done.error
    assert effects_of(run_id)[durable.idempotency_key(run_id, CHARGE, branch=1)] == 1
    decisions = RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.OPERATOR_APPROVE)
    assert [e.data["arguments"] for e in decisions] == [
        {"amount_cents": 4500},
        {"amount_cents": 3000},
    ]


# --- ctx.sleep and ctx.wait_for -----------------------------------------------------------------
def test_agent_sleep_then_signal__each_wait_replayed_from_its_checkpoint() -> None:
    run_id = durable.start(workflows.waiting_agent.name)

    found = waiting(run_id)
    assert found.waiting_for == "timer"
    aging.runs_age([run_id], seconds=60)
    found = run_to_end(run_id)  # the timer is waited out; the signal is not
    assert found.waiting_for == "signal"
    assert durable.signal(run_id, "reply", {"ok": 1}, signal_id="s-1") == "delivered"
    assert durable.signal(run_id, "reply", {"ok": 2}, signal_id="s-1") == "duplicate"
    done = run_to_end(run_id)

    assert done.status == RunStatus.COMPLETED, done.error
    assert done.output == {"payload": {"ok": 1}, "timed_out": False}
    names = [s.name for s in done.steps]
    assert names == ["prepare", "sleep", "wait_for:reply", "finish"]
    assert partner.execution_counts(run_id)[(run_id, 1, "prepare")] == 1


def test_agent_wait_for__timeout_is_an_outcome_the_function_reads() -> None:
    run_id = durable.start(workflows.waiting_agent.name, input={"sleep": 0, "timeout": 30})
    found = run_to_end(run_id, retries=False)
    assert found.waiting_for == "signal"

    aging.runs_age([run_id], seconds=31)
    done = run_to_end(run_id)

    assert done.status == RunStatus.COMPLETED, done.error
    assert done.output == {"payload": None, "timed_out": True}


def timed_out_then_parked(run_id: str) -> None:
    """Let the charge's approval time out (the call records the timed-out rejection), then
    park the run before its next model turn (as if that turn had diverged)."""
    waiting(run_id)
    aging.runs_age([run_id], seconds=48 * 3600 + 1)
    with capture_messages():
        runtime.run_step(run_id, CHARGE)
    found = durable.snapshot(run_id)
    assert found is not None
    assert found.steps[CHARGE - 1].output["result"]["timed_out"] is True
    assert store.run_park(run_id, CHARGE + 1, "parked for the test", fence=None)


def test_fork__after_a_timed_out_approval__the_new_branch_asks_again() -> None:
    """A timeout is no operator's decision: a fork's byte-identical call waits for one, rather
    than adopting the superseded branch's timed-out rejection as if it were decided."""
    run_id = durable.start(workflows.cashier.name)
    timed_out_then_parked(run_id)

    durable.fork(run_id, position=1, actor="ops", reason="ask the approvers again")
    found = waiting(run_id)

    assert found.waiting_for == "approval"
    assert found.pending_approval is not None
    assert found.pending_approval["arguments"] == {"amount_cents": 4500}
    durable.approve(run_id, actor="alice", reason="fee confirmed after all")
    done = run_to_end(run_id)
    assert done.status == RunStatus.COMPLETED, done.error
    assert effects_of(run_id) == {durable.idempotency_key(run_id, CHARGE, branch=1): 1}


def test_fork__after_a_rejection__the_byte_identical_call_keeps_the_rejection() -> None:
    """An operator's rejection is a decision on that exact call: the fork's identical call
    reuses it and runs nothing."""
    run_id = durable.start(workflows.cashier.name)
    waiting(run_id)
    durable.reject(run_id, actor="bob", reason="no")
    with capture_messages():
        runtime.run_step(run_id, CHARGE)
    assert store.run_park(run_id, CHARGE + 1, "parked for the test", fence=None)

    durable.fork(run_id, position=1, actor="ops", reason="try again")
    done = run_to_end(run_id)

    assert done.status == RunStatus.COMPLETED, done.error
    assert '"rejected":true' in done.output
    assert effects_of(run_id) == {}


def test_signal_while_parked__kept__the_forks_new_branch_takes_it_at_its_wait_once() -> None:
    """A run parked while it waits for a signal, then forked: a signal sent while it was parked
    is kept (the run is not finished), the new branch's wait at the same position takes it
    without waiting, and its id stays spent."""
    run_id = durable.start(workflows.waiting_agent.name, input={"sleep": 0})
    found = run_to_end(run_id, retries=False)
    assert found.waiting_for == "signal"
    position = len(found.steps) + 1  # prepare and sleep are recorded; the wait is next
    assert store.run_park(run_id, position, "parked for the test", fence=None)
    assert durable.signal(run_id, "reply", {"ok": 0}, signal_id="s-0") == "delivered"  # kept

    durable.fork(run_id, position=1, actor="ops", reason="try again")
    done = run_to_end(run_id)

    assert done.status == RunStatus.COMPLETED, done.error
    assert done.output == {"payload": {"ok": 0}, "timed_out": False}
    assert durable.signal(run_id, "reply", {"ok": 2}, signal_id="s-0") == "duplicate"
    [signal] = RunSignal.objects.filter(run_id=run_id)
    assert (signal.branch, signal.seq, signal.signal_id) == (1, position, "s-0")
    assert partner.execution_counts(run_id)[(run_id, 1, "prepare")] == 1  # reused, not rerun


def test_agent_wait_for__signals_sent_before__each_wait_takes_the_oldest_in_order() -> None:
    run_id = durable.start(workflows.two_replies_agent.name)
    for n in (1, 2):
        assert durable.signal(run_id, "reply", {"n": n}, signal_id=f"s-{n}") == "delivered"
    partner.release(run_id)

    done = run_to_end(run_id, retries=False)

    assert done.status == RunStatus.COMPLETED, done.error
    assert done.output == {"heard": [{"n": 1}, {"n": 2}]}
    names = [s.name for s in done.steps]
    assert names == ["prepare", "wait_for:reply", "wait_for:reply", "finish"]
    signals = RunSignal.objects.filter(run_id=run_id).order_by("seq")
    assert [(s.signal_id, s.seq) for s in signals] == [("s-1", 2), ("s-2", 3)]
    assert not RunWait.objects.filter(run_id=run_id).exclude(resolved_at=F("requested_at"))
