"""Timers, signals and approvals in step graphs
(docs/workflows.md, "Timers, signals and approvals"), in this process against real Postgres: a run
waits holding no worker, a signal acts once per id, a decision is recorded at its position with the
operator and reason, and a timeout is an outcome the workflow handles."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import connection, transaction

from agentflow import _store as store
from agentflow import durable
from agentflow._base.states import RunStatus, StepKind, StepStatus
from agentflow._engine import runtime
from agentflow._recovery import sweeper
from agentflow._store import aging
from agentflow.models import RunEvent, RunSignal, RunWait, StepCheckpoint, WorkflowRun
from agentflow.testing import SimulatedCrash, StepMessage, capture_messages, crash_at, run_to_end
from agentflow.testing.waiting import wait_for
from tests.support import partner, workflows

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]


def waiting(run_id: str) -> durable.RunSnapshot:
    found = run_to_end(run_id, retries=False)
    assert found.status == RunStatus.WAITING, found.error
    return found


def deliver(messages: list[StepMessage]) -> None:
    """What a worker does with the sweeper's messages."""
    assert messages
    with capture_messages():
        for message in messages:
            runtime.run_step(message.run_id, message.seq)


def charge_keys(run_id: str) -> dict[str, int]:
    return {k: n for k, n in partner.effects().items() if k.startswith(f"{run_id}_")}


# --- approvals ----------------------------------------------------------------------------------
def test_approval__the_run_waits_showing_the_exact_call_and_no_effect_is_made() -> None:
    run_id = durable.start(workflows.approval.name, input={"amount": 4500})

    found = waiting(run_id)

    assert found.waiting_for == "approval"
    pending = found.pending_approval
    assert pending is not None
    assert (pending["call"], pending["arguments"]) == ("charge", {"amount": 4500})
    assert len(pending["digest"]) == 64
    assert pending["expires_at"] > pending["requested_at"]
    assert charge_keys(run_id) == {}
    assert not StepCheckpoint.objects.filter(run_id=run_id, seq=2).exists()
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.wake_at == pending["expires_at"]  # no worker held: the deadline wakes it


def test_approval__approve__the_step_runs_once_with_the_decision() -> None:
    run_id = durable.start(workflows.approval.name, input={"amount": 4500})
    waiting(run_id)

    durable.approve(run_id, actor="alice", reason="customer called")
    done = run_to_end(run_id)

    assert done.status == RunStatus.COMPLETED, done.error
    assert [s.name for s in done.steps] == ["prepare", "charge", "finish"]
    assert done.steps[1].output["approved_by"] == "alice"
    assert charge_keys(run_id) == {durable.idempotency_key(run_id, 2): 1}
    event = RunEvent.objects.get(run_id=run_id, kind=RunEvent.Kind.OPERATOR_APPROVE)
    assert (event.actor, event.detail, event.seq) == ("alice", "customer called", 2)
    assert event.data["arguments"] == {"amount": 4500}
    wait = RunWait.objects.get(run_id=run_id)
    assert (wait.actor, wait.reason, wait.outcome["approved"]) == ("alice", "customer called", True)
    assert done.waiting_for is None and done.pending_approval is None


def test_approval__reject__the_step_does_not_run_and_the_branch_takes_the_rejection() -> None:
    run_id = durable.start(workflows.approval.name, input={"amount": 4500})
    waiting(run_id)

    durable.reject(run_id, actor="bob", reason="looks like fraud", reply="We can't take it.")
    done = run_to_end(run_id)

    assert done.status == RunStatus.COMPLETED, done.error
    assert [s.name for s in done.steps] == ["prepare", "charge", "declined"]
    charge = done.steps[1]
    assert charge.output == {
        "approved": False,
        "actor": "bob",
        "reason": "looks like fraud",
        "timed_out": False,
        "reply": "We can't take it.",
    }
    assert charge.kind == StepKind.READ  # nothing acted: nothing may have happened
    assert not durable.may_have_happened(charge)
    assert charge_keys(run_id) == {}
    assert partner.execution_counts(run_id)[(run_id, 2, "charge")] == 0


def test_approval__bound_to_the_exact_call__another_amount_at_the_position_waits_again() -> None:
    run_id = durable.start(workflows.approval.name, input={"amount": 4500})
    waiting(run_id)
    durable.approve(run_id, actor="alice", reason="for 4500")
    WorkflowRun.objects.filter(pk=run_id).update(input={"amount": 9900})  # the call changed

    found = waiting(run_id)

    assert found.pending_approval is not None
    assert found.pending_approval["arguments"] == {"amount": 9900}
    assert charge_keys(run_id) == {}  # the decision on 4500 does not buy a charge of 9900
    replaced = RunEvent.objects.get(
        run_id=run_id, kind=RunEvent.Kind.WAITING, data__has_key="replaced"
    )
    assert replaced.data["replaced"]["outcome"]["approved"] is True  # kept for audit


def test_approval__predicate_false__runs_at_once_without_waiting() -> None:
    run_id = durable.start(workflows.approval.name, input={"amount": 500})

    done = run_to_end(run_id)

    assert done.status == RunStatus.COMPLETED
    assert not RunWait.objects.filter(run_id=run_id).exists()
    assert charge_keys(run_id) == {durable.idempotency_key(run_id, 2): 1}


def test_approval__timeout__takes_the_reject_path_and_a_late_approve_is_refused() -> None:
    run_id = durable.start(workflows.approval.name, input={"amount": 4500})
    found = waiting(run_id)
    seconds = found.pending_approval["expires_at"] - found.pending_approval["requested_at"]
    assert seconds.total_seconds() == 48 * 3600  # AGENTFLOW_APPROVAL_TIMEOUT's default

    aging.runs_age([run_id], seconds=48 * 3600 + 1)  # by the database's clock
    with pytest.raises(durable.ActionRefused, match="timed out"):
        durable.approve(run_id, actor="alice", reason="too late")
    with capture_messages() as outbox:
        report = sweeper.sweep()
    assert run_id in report.requeued
    deliver(outbox.for_run(run_id))
    done = run_to_end(run_id)

    assert [s.name for s in done.steps] == ["prepare", "charge", "declined"]
    assert done.steps[1].output["timed_out"] is True
    assert done.steps[1].output["approved"] is False
    assert charge_keys(run_id) == {}
    assert RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.WAIT_TIMED_OUT).exists()


def test_approval__refused_with_the_reason_when_nothing_waits_for_it() -> None:
    with pytest.raises(durable.ActionRefused, match="no such run"):
        durable.approve("wf_nope", actor="alice")
    run_id = durable.start(workflows.approval.name, input={"amount": 500})
    with pytest.raises(durable.ActionRefused, match="nothing waits for approval"):
        durable.approve(run_id, actor="alice")  # pending, not waiting
    run_to_end(run_id)
    with pytest.raises(durable.ActionRefused, match="finished"):
        durable.reject(run_id, actor="alice", reason="no")
    signal_run = durable.start(workflows.signalled.name)
    waiting(signal_run)
    with pytest.raises(durable.ActionRefused, match="waits for a signal"):
        durable.approve(signal_run, actor="alice")
    with pytest.raises(durable.InvalidInputError, match="actor"):
        durable.approve(signal_run, actor=" ")


def test_approval__twice__the_second_decision_is_refused() -> None:
    run_id = durable.start(workflows.approval.name, input={"amount": 4500})
    waiting(run_id)

    durable.approve(run_id, actor="alice", reason="ok")
    with pytest.raises(durable.ActionRefused, match="nothing waits for approval"):
        durable.reject(run_id, actor="bob", reason="no")

    assert run_to_end(run_id).status == RunStatus.COMPLETED
    assert RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.OPERATOR_REJECT).count() == 0


def test_approval__racing_cancel__whichever_comes_second_is_refused() -> None:
    first = durable.start(workflows.approval.name, input={"amount": 4500})
    waiting(first)
    durable.cancel(first, actor="carol", reason="customer withdrew")
    with pytest.raises(durable.ActionRefused):
        durable.approve(first, actor="alice", reason="ok")
    assert run_to_end(first).status == RunStatus.CANCELLED
    assert charge_keys(first) == {}

    second = durable.start(workflows.approval.name, input={"amount": 4500})
    waiting(second)
    with pytest.raises(durable.ActionRefused, match="only failed or parked runs"):
        durable.retry(second, actor="dave", reason="while it waits")
    durable.approve(second, actor="alice", reason="ok")
    durable.cancel(second, actor="carol", reason="customer withdrew")
    done = run_to_end(second)
    assert done.status == RunStatus.CANCELLED
    assert charge_keys(second) == {}  # the approved charge never ran: the cancel came first


def test_approval__racing_a_cancel_that_holds_the_run__waits_for_it_then_is_refused() -> None:
    """The real race: Cancel holds the run's row lock when Approve arrives; Approve waits for
    it (the same lock every operator action takes), then finds the run cancelled."""
    run_id = durable.start(workflows.approval.name, input={"amount": 4500})
    waiting(run_id)
    outcome: list[BaseException | None] = []

    def approve() -> None:
        try:
            durable.approve(run_id, actor="alice", reason="ok")
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)
        finally:
            connection.close()

    with transaction.atomic():
        durable.cancel(run_id, actor="carol", reason="customer withdrew")
        racer = threading.Thread(target=approve)
        racer.start()
        wait_for(
            lambda: blocked_on_a_lock() or outcome,
            timeout=10,
            interval=0.02,
            what="approve to wait",
        )
        assert not outcome, outcome  # it waits for the lock, it has not decided anything
    racer.join(timeout=10)

    assert len(outcome) == 1 and isinstance(outcome[0], durable.ActionRefused), outcome
    assert run_to_end(run_id).status == RunStatus.CANCELLED
    assert charge_keys(run_id) == {}
    assert not RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.OPERATOR_APPROVE)


def blocked_on_a_lock() -> bool:
    """Another session of this database waits for a lock (the racer, on the run's row)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # else one snapshot per transaction
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return bool(cursor.fetchone()[0])


# --- signals ------------------------------------------------------------------------------------
def test_signal__delivered_once__a_repeated_signal_id_is_acknowledged_and_ignored() -> None:
    run_id = durable.start(workflows.signalled.name)
    found = waiting(run_id)
    assert found.waiting_for == "signal" and found.pending_approval is None

    assert durable.signal(run_id, "reply", {"text": "yes"}, signal_id="msg-1") == "delivered"
    assert durable.signal(run_id, "reply", {"text": "again"}, signal_id="msg-1") == "duplicate"
    done = run_to_end(run_id)
    assert durable.signal(run_id, "reply", {"text": "late"}, signal_id="msg-1") == "duplicate"

    assert done.status == RunStatus.COMPLETED, done.error
    assert done.steps[1].name == "reply"
    assert done.steps[1].output == {"payload": {"text": "yes"}}
    assert RunSignal.objects.filter(run_id=run_id).count() == 1
    assert RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.SIGNAL).count() == 1


def test_signal__refused_with_the_reason_only_once_the_run_is_finished() -> None:
    run_id = durable.start(workflows.signalled.name)
    with pytest.raises(durable.InvalidInputError, match="signal_id"):
        durable.signal(run_id, "reply", signal_id="")
    with pytest.raises(durable.InvalidInputError, match="JSON"):
        durable.signal(run_id, "reply", object(), signal_id="y")
    waiting(run_id)
    assert durable.signal(run_id, "other", signal_id="x") == "delivered"  # kept: no wait takes it
    durable.signal(run_id, "reply", signal_id="ok")
    run_to_end(run_id)
    with pytest.raises(durable.ActionRefused, match="finished"):
        durable.signal(run_id, "reply", signal_id="after")
    with pytest.raises(durable.ActionRefused, match="no such run"):
        durable.signal("wf_nope", "reply", signal_id="z")
    kept = RunSignal.objects.get(run_id=run_id, signal_id="x")
    assert (kept.name, kept.consumed_at, kept.seq) == ("other", None, None)


def test_signal__timeout_is_an_outcome_the_workflow_reads() -> None:
    run_id = durable.start(workflows.signal_or_timeout.name)
    waiting(run_id)

    aging.runs_age([run_id], seconds=61)
    assert durable.signal(run_id, "reply", signal_id="late") == "delivered"  # kept, too late
    done = run_to_end(run_id)

    assert done.status == RunStatus.COMPLETED
    assert done.steps[1].output == {"timed_out": True}
    assert RunSignal.objects.get(run_id=run_id, signal_id="late").consumed_at is None


# --- early signals: kept until a wait takes them --------------------------------------------------
#: What `two_replies` finishes with when its waits took {"n": 1}, then {"n": 2}.
IN_ORDER = {"first": {"payload": {"n": 1}}, "second": {"payload": {"n": 2}}}


def kept(run_id: str) -> list[str]:
    """The run's signals no wait has consumed, oldest first."""
    rows = RunSignal.objects.filter(run_id=run_id, consumed_at__isnull=True).order_by("id")
    return [row.signal_id for row in rows]


def test_early_signal__kept__the_wait_takes_it_when_the_run_gets_there_and_does_not_wait() -> None:
    run_id = durable.start(workflows.signalled.name)

    assert durable.signal(run_id, "reply", {"text": "early"}, signal_id="s-1") == "delivered"
    assert durable.signal(run_id, "reply", {"text": "again"}, signal_id="s-1") == "duplicate"
    assert kept(run_id) == ["s-1"]
    with capture_messages() as outbox:
        runtime.run_step(run_id, 1)
        runtime.run_step(run_id, 2)  # the wait: it takes the signal and the step completes

    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.current_seq) == (RunStatus.RUNNING, 3)  # never WAITING
    assert [m.seq for m in outbox.for_run(run_id)] == [2, 3]  # no countdown, no doorbell
    done = run_to_end(run_id)
    assert done.status == RunStatus.COMPLETED, done.error
    assert done.steps[1].output == {"payload": {"text": "early"}}
    wait = RunWait.objects.get(run_id=run_id)
    assert wait.resolved_at == wait.requested_at  # resolved in the commit that recorded it
    assert (wait.actor, wait.reason) == ("signal", "s-1")
    signal = RunSignal.objects.get(run_id=run_id)
    assert (signal.branch, signal.seq) == (0, 2) and signal.consumed_at == wait.resolved_at
    assert kept(run_id) == []
    taken = RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.SIGNAL).order_by("id")
    assert [e.data.get("kept", False) for e in taken] == [True, False]  # received, then taken


def test_two_signals_of_one_name__the_waits_take_them_in_the_order_sent() -> None:
    run_id = durable.start(workflows.two_replies.name)
    for n in (1, 2, 3):
        assert durable.signal(run_id, "reply", {"n": n}, signal_id=f"s-{n}") == "delivered"
    partner.release(run_id)

    done = run_to_end(run_id)

    assert done.status == RunStatus.COMPLETED, done.error
    assert done.steps[-1].output == IN_ORDER
    assert kept(run_id) == ["s-3"]  # no third wait: it stays, visible on the run page
    consumed = RunSignal.objects.filter(run_id=run_id, consumed_at__isnull=False).order_by("seq")
    assert [(s.signal_id, s.seq) for s in consumed] == [("s-1", 2), ("s-2", 3)]


def test_two_signals__one_early_one_while_waiting__each_wait_takes_one_in_order() -> None:
    run_id = durable.start(workflows.two_replies.name)
    durable.signal(run_id, "reply", {"n": 1}, signal_id="s-1")
    partner.release(run_id)
    found = waiting(run_id)  # took s-1 at once, then waits at the second
    assert found.waiting_for == "signal" and len(found.steps) == 2

    durable.signal(run_id, "reply", {"n": 2}, signal_id="s-2")  # delivered to that wait
    done = run_to_end(run_id)

    assert done.steps[-1].output == IN_ORDER
    assert kept(run_id) == []


def test_early_signal__after_a_waits_timeout__kept_for_the_next_wait_not_that_one() -> None:
    """Whichever the database's clock saw first decides: a signal that came after the first
    wait's deadline (before a worker noticed it) is no answer to it; the next wait takes it."""
    run_id = durable.start(workflows.late_reply.name)
    waiting(run_id)
    aging.runs_age([run_id], seconds=61)

    durable.signal(run_id, "reply", {"n": 1}, signal_id="late")
    done = run_to_end(run_id)

    assert done.status == RunStatus.COMPLETED, done.error
    assert done.steps[-1].output == {"first": {"timed_out": True}, "second": {"payload": {"n": 1}}}
    assert RunSignal.objects.get(run_id=run_id).seq == 3


def test_early_signal__killed_after_the_wait_took_it__the_redelivery_takes_no_other() -> None:
    """The take is committed with the wait's outcome; the worker dies before the step's
    checkpoint. The redelivery reads the wait's outcome: the same signal, and the next one kept
    is left for the next wait."""
    run_id = durable.start(workflows.two_replies.name)
    durable.signal(run_id, "reply", {"n": 1}, signal_id="s-1")
    durable.signal(run_id, "reply", {"n": 2}, signal_id="s-2")
    partner.release(run_id)
    with capture_messages():
        runtime.run_step(run_id, 1)
    with crash_at("first:after_effect"), capture_messages(), pytest.raises(SimulatedCrash):
        runtime.run_step(run_id, 2)
    assert not StepCheckpoint.objects.filter(run_id=run_id, seq=2).exists()
    assert kept(run_id) == ["s-2"]

    done = run_to_end(run_id)

    assert done.steps[-1].output == IN_ORDER
    consumed = RunSignal.objects.order_by("seq").filter(run_id=run_id)
    assert [(s.signal_id, s.seq) for s in consumed] == [("s-1", 2), ("s-2", 3)]


def test_signal_racing_the_run_to_its_wait__taken_once_whichever_holds_the_run_first() -> None:
    """The signal's delivery and the worker's arrival at the wait both take the run's row
    lock. Signal first: the wait finds it kept and does not wait. Wait first: the delivery
    finds the run waiting and hands it over. Either way one consumption, one completion."""
    # The signal holds the run while the worker arrives at the wait.
    first = durable.start(workflows.signalled.name)
    with capture_messages():
        runtime.run_step(first, 1)
    with transaction.atomic():
        assert durable.signal(first, "reply", {"who": "signal"}, signal_id="a") == "delivered"
        worker = Racing(lambda: runtime.run_step(first, 2))
    worker.finish()
    assert StepCheckpoint.objects.get(run_id=first, seq=2).output == {"payload": {"who": "signal"}}

    # The worker holds the run while it records the wait; the signal arrives meanwhile.
    second = durable.start(workflows.signalled.name)
    with capture_messages():
        runtime.run_step(second, 1)
    state = store.state_load(second, 2)
    assert state is not None
    spec = workflows.signalled.step_named("reply").waits_for(None)
    with capture_messages():
        with transaction.atomic():
            assert store.wait_settle(state, spec, 2) is None  # recorded: WAITING, lock held
            sender = Racing(lambda: durable.signal(second, "reply", {"who": "w"}, signal_id="b"))
        sender.finish()
    assert durable.snapshot(second).waiting_for is None  # type: ignore[union-attr]
    done = run_to_end(second)
    assert done.steps[1].output == {"payload": {"who": "w"}}
    for run_id in (first, second):
        assert RunSignal.objects.get(run_id=run_id).seq == 2
        assert kept(run_id) == []


class Racing:
    """Run `fn` in a thread that must block on a lock this test holds; `finish()` joins it
    (after the holder committed) and re-raises what it raised."""

    def __init__(self, fn: Callable[[], object]) -> None:
        self.outcome: list[BaseException | None] = []

        def run() -> None:
            try:
                with capture_messages():
                    fn()
                self.outcome.append(None)
            except BaseException as exc:
                self.outcome.append(exc)
            finally:
                connection.close()

        self.thread = threading.Thread(target=run)
        self.thread.start()
        wait_for(
            lambda: blocked_on_a_lock() or self.outcome, timeout=10, interval=0.02, what="a lock"
        )
        assert not self.outcome, self.outcome  # it waits for the lock

    def finish(self) -> None:
        self.thread.join(timeout=10)
        assert self.outcome == [None], self.outcome


# --- timers -------------------------------------------------------------------------------------
def test_timer__waits_holding_no_worker__the_sweeper_wakes_it_at_its_time() -> None:
    run_id = durable.start(workflows.timed.name)
    found = waiting(run_id)
    assert found.waiting_for == "timer"
    wait = RunWait.objects.get(run_id=run_id)
    assert WorkflowRun.objects.get(pk=run_id).wake_at == wait.deadline

    with capture_messages() as outbox:
        assert run_id not in sweeper.sweep().requeued  # not due: left alone
        aging.runs_age([run_id], seconds=120)
        assert run_id in sweeper.sweep().requeued
    assert [m.seq for m in outbox.for_run(run_id)] == [2]
    deliver(outbox.for_run(run_id))
    done = run_to_end(run_id, retries=False)

    assert done.status == RunStatus.COMPLETED, done.error
    cool_off = StepCheckpoint.objects.get(run_id=run_id, seq=2)
    assert (cool_off.name, cool_off.status) == ("cool_off", StepStatus.COMPLETED)
    wait.refresh_from_db()  # (aged with the run)
    assert cool_off.output == {"woke_at": wait.deadline.isoformat()}  # the recorded time


# --- stale and early messages -------------------------------------------------------------------
def test_approval__stale_and_early_messages_before_the_deadline__change_nothing() -> None:
    """A duplicate, a broker redelivery and a sweep before the deadline all find the run
    waiting: nothing is claimed, nothing runs, and it still wakes at its deadline."""
    run_id = durable.start(workflows.approval.name, input={"amount": 4500})
    found = waiting(run_id)
    deadline = found.pending_approval["expires_at"]

    with capture_messages() as outbox:
        runtime.run_step(run_id, 2)
        runtime.run_step(run_id, 2, redelivered=True)
        assert run_id not in sweeper.sweep().requeued

    assert outbox.for_run(run_id) == []
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.wake_at) == (RunStatus.WAITING, deadline)
    assert not StepCheckpoint.objects.filter(run_id=run_id, seq=2).exists()
    assert charge_keys(run_id) == {}
    assert durable.snapshot(run_id).waiting_for == "approval"


def test_approval__a_message_hinting_a_claim_on_load__still_waits_before_claiming() -> None:
    """A step message carrying a claim-on-load hint for a step that waits (one published by a
    release that did not know the step waits) must not claim it: the wait comes first, and a
    claimed checkpoint would read as an effect that may have happened."""
    run_id = durable.start(workflows.approval.name, input={"amount": 4500})
    with capture_messages():
        runtime.run_step(run_id, 1)

    with capture_messages():
        runtime.run_step(run_id, 2, fresh=[workflows.approval.name, 1, "charge"])

    assert durable.snapshot(run_id).waiting_for == "approval"
    assert not StepCheckpoint.objects.filter(run_id=run_id, seq=2).exists()
    assert charge_keys(run_id) == {}


def test_approval__approve_after_the_timeout_took_the_reject_path__refused_saying_so() -> None:
    """The timeout is recorded, then the worker dies before the rejection is checkpointed
    (the run still reads WAITING): a late approve is refused as timed out, and the
    redelivery finishes the reject path without charging."""
    run_id = durable.start(workflows.approval.name, input={"amount": 4500})
    waiting(run_id)
    aging.runs_age([run_id], seconds=48 * 3600 + 1)

    with crash_at("charge:after_effect"), capture_messages(), pytest.raises(SimulatedCrash):
        runtime.run_step(run_id, 2)
    assert RunWait.objects.get(run_id=run_id).outcome["timed_out"] is True
    with pytest.raises(durable.ActionRefused, match="timed out"):
        durable.approve(run_id, actor="alice", reason="too late")
    done = run_to_end(run_id)

    assert [s.name for s in done.steps] == ["prepare", "charge", "declined"]
    assert done.steps[1].kind == StepKind.READ
    assert charge_keys(run_id) == {}


def test_approval__approved_charge_made_then_its_predicate_raises__no_money_kept() -> None:
    """The approved charge is made, its worker dies before checkpointing it; on the takeover
    the approval's predicate raises. That is no proof the charge did not happen: the run must
    not fail with the charge written off as never made (it would keep the money, I8)."""
    run_id = durable.start(workflows.approved_refundable.name, input={"amount": 4500})
    waiting(run_id)
    durable.approve(run_id, actor="alice", reason="ok")
    with crash_at("charge:after_effect"), capture_messages(), pytest.raises(SimulatedCrash):
        runtime.run_step(run_id, 2)
    assert charge_keys(run_id) == {durable.idempotency_key(run_id, 2): 1}
    partner.release(f"{run_id}/predicate-broken")

    with capture_messages():
        runtime.run_step(run_id, 2, redelivered=True)

    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.NEEDS_ATTENTION, (run.status, run.error)
    assert run.error.startswith("outcome unknown: charge may have taken effect")
    charge = StepCheckpoint.objects.get(run_id=run_id, seq=2)
    assert (charge.kind, charge.status) == (StepKind.EFFECT, StepStatus.IN_PROGRESS)

    partner.release(f"{run_id}/predicate-fixed")  # fixed; the operator retries
    durable.retry(run_id, actor="ops", reason="predicate fixed")
    done = run_to_end(run_id)
    assert done.status == RunStatus.COMPLETED, done.error
    assert charge_keys(run_id) == {durable.idempotency_key(run_id, 2): 1}  # made once


def test_approval__approve_and_reject_at_once__exactly_one_decides_and_the_run_follows_it() -> None:
    """Two approvers press at once (one Approve, one Reject), both queued on the run's row
    lock: one decision is recorded, the other refused, and the run does what was recorded."""
    run_id = durable.start(workflows.approval.name, input={"amount": 4500})
    waiting(run_id)
    outcomes: dict[str, BaseException | None] = {}

    def decide(approved: bool) -> None:
        name = "approve" if approved else "reject"
        try:
            decide_fn = durable.approve if approved else durable.reject
            decide_fn(run_id, actor=name, reason=f"{name} at once")
            outcomes[name] = None
        except BaseException as exc:
            outcomes[name] = exc
        finally:
            connection.close()

    with transaction.atomic():
        WorkflowRun.objects.select_for_update().get(pk=run_id)  # both queue behind this
        racers = [threading.Thread(target=decide, args=(flag,)) for flag in (True, False)]
        for racer in racers:
            racer.start()
        wait_for(
            lambda: lock_waiters() == 2 or outcomes, timeout=10, interval=0.02, what="both wait"
        )
        assert not outcomes, outcomes
    for racer in racers:
        racer.join(timeout=10)

    winners = [name for name, exc in outcomes.items() if exc is None]
    assert len(winners) == 1, outcomes
    [loser] = [exc for exc in outcomes.values() if exc is not None]
    assert isinstance(loser, durable.ActionRefused), loser
    done = run_to_end(run_id)
    if winners == ["approve"]:
        assert [s.name for s in done.steps] == ["prepare", "charge", "finish"]
        assert charge_keys(run_id) == {durable.idempotency_key(run_id, 2): 1}
    else:
        assert [s.name for s in done.steps] == ["prepare", "charge", "declined"]
        assert charge_keys(run_id) == {}
    decided = RunEvent.objects.filter(
        run_id=run_id, kind__in=[RunEvent.Kind.OPERATOR_APPROVE, RunEvent.Kind.OPERATOR_REJECT]
    )
    assert [e.actor for e in decided] == winners


def lock_waiters() -> int:
    """Sessions of this database waiting for a lock (the racers, on the run's row)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def test_timer__its_doorbell_delivered_early__rings_no_second_one() -> None:
    """The countdown a short wait publishes as it goes WAITING can arrive before its time (a
    worker's clock ahead of the database's, a broker's early redelivery). That delivery finds
    the run still waiting and must not publish another, or every early or duplicate delivery
    rings again (with immediate doorbells, for ever): the deadline's wake-up time and the
    sweeper stand behind it."""
    run_id = durable.start(workflows.short_timer.name)
    with capture_messages() as outbox:
        runtime.run_step(run_id, 1)
        runtime.run_step(run_id, 2)
    [doorbell] = [m for m in outbox.for_run(run_id) if m.seq == 2 and m.countdown]
    assert 0 < doorbell.countdown <= 3

    with capture_messages() as again:
        runtime.run_step(run_id, 2)  # early: the timer has not run out
        runtime.run_step(run_id, 2)  # and a duplicate of it

    assert again.for_run(run_id) == []
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.wake_at) == (RunStatus.WAITING, RunWait.objects.get(run=run).deadline)
    aging.runs_age([run_id], seconds=3)
    with capture_messages() as swept:
        assert run_id in sweeper.sweep().requeued  # its wake-up time still wakes it
    deliver(swept.for_run(run_id))
    assert run_to_end(run_id).status == RunStatus.COMPLETED


def test_approval__call_changed_after_the_approved_charge_was_made__never_written_off() -> None:
    """The approved charge of 4500 is made and its worker dies before checkpointing it; then
    the call at the position reads 9900. Setting the decision aside and asking again would
    leave a charge that may have happened under a fresh wait, which a rejection would then
    overwrite as a call that never ran: the run is parked for an operator instead."""
    run_id = durable.start(workflows.approved_refundable.name, input={"amount": 4500})
    waiting(run_id)
    durable.approve(run_id, actor="alice", reason="for 4500")
    with crash_at("charge:after_effect"), capture_messages(), pytest.raises(SimulatedCrash):
        runtime.run_step(run_id, 2)
    WorkflowRun.objects.filter(pk=run_id).update(input={"amount": 9900})  # the call changed

    with capture_messages():
        runtime.run_step(run_id, 2, redelivered=True)

    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.NEEDS_ATTENTION, (run.status, run.error)
    assert run.error.startswith("outcome unknown: charge")
    with pytest.raises(durable.ActionRefused):
        durable.reject(run_id, actor="bob", reason="not 9900")
    charge = StepCheckpoint.objects.get(run_id=run_id, seq=2)
    assert (charge.kind, charge.status) == (StepKind.EFFECT, StepStatus.IN_PROGRESS)
    assert RunWait.objects.get(run_id=run_id).outcome["approved"] is True  # kept
