"""A member of a batch of read-only calls fails as a read step does (docs/protocol.md, "What a
failure means"; `agentflow.agent.steps`): the classifier's verdict, recorded by the batch's own
fenced writes. Played in this process against real Postgres, with the agent batch fixtures of
`tests/support/limited_agent.py`."""

from __future__ import annotations

import pytest
from django.test import override_settings

from agentflow import durable
from agentflow._base.states import RunStatus, StepStatus
from agentflow._engine import runtime
from agentflow.models import RunEvent, StepCheckpoint, WorkflowRun
from tests.support import limited_agent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]

DISAGREE = "check_till: the till and the shelf disagree"


def _begun(trouble: str) -> str:
    """A troubled run with its batch begun at 2-3 and its first member, the till check, run."""
    run_id = durable.start(limited_agent.troubled_agent.name, input={"trouble": trouble})
    runtime.run_step(run_id, 1)  # the model's turn asks for both at once
    runtime.run_step(run_id, 2)  # begins the batch 2-3, and runs the till check
    return run_id


def test_a_member_asking_for_a_person__parks_the_run_at_its_batch__its_sibling_fenced_out() -> None:
    run_id = _begun("disagree")

    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.NEEDS_ATTENTION  # parked, not failed "unexpected ..."
    assert run.error == DISAGREE
    assert (run.current_seq, run.batch_last) == (2, 3)  # still at its batch
    [event] = RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.NEEDS_ATTENTION)
    assert (event.seq, event.detail) == (2, DISAGREE)
    assert event.data["error"] == "the till and the shelf disagree"
    assert not StepCheckpoint.objects.filter(run_id=run_id, seq=2).exists()  # a read's park

    runtime.run_step(run_id, 3)  # the sibling's message, while the run is parked

    assert not StepCheckpoint.objects.filter(run_id=run_id, seq=3).exists()
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.NEEDS_ATTENTION


def test_a_parked_batch__retried__runs_its_members_again_at_the_batch() -> None:
    run_id = _begun("disagree")

    durable.retry(run_id, actor="ops", reason="looked at the till")
    runtime.run_step(run_id, 3)  # the price: recorded while the batch runs again
    runtime.run_step(run_id, 2)  # the till check asks again

    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.error) == (RunStatus.NEEDS_ATTENTION, DISAGREE)
    assert (run.current_seq, run.batch_last) == (2, 3)
    price = StepCheckpoint.objects.get(run_id=run_id, seq=3)
    assert (price.name, price.status) == ("lookup_price", StepStatus.COMPLETED)
    parked = RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.NEEDS_ATTENTION)
    assert [e.seq for e in parked] == [2, 2]


@override_settings(AGENTFLOW_PARTNER_LIMITS={limited_agent.PARTNER: {"rate": "1/m"}})
def test_a_member_whose_call_failed_then_got_no_turn__waits__no_attempt_spent() -> None:
    """The till's first call takes the partner's turn and fails; its second gets no turn. A
    read's wait, even after a failed call, is no attempt: the member waits for its turn (it
    was once recorded a FAILED attempt, retried after the wait)."""
    run_id = _begun("flaky")

    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.RUNNING  # its sibling still goes
    assert (run.current_seq, run.batch_last) == (2, 3)
    assert run.hold == f"partner:{limited_agent.PARTNER}"
    assert not StepCheckpoint.objects.filter(run_id=run_id, seq=2).exists()  # no attempt spent
    [held] = RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.HELD)
    assert held.seq == 2
    assert held.detail.startswith(f"waiting for {limited_agent.PARTNER}: ")
    snapshot = durable.snapshot(run_id)
    assert snapshot is not None and snapshot.held == held.detail


def test_database_trouble_in_a_member__retried_as_a_reads__no_traceback_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The database failing a member's statement is no bug of the member: its attempt is
    recorded FAILED and retried after its back-off, as a read step's is (it was once re-raised,
    its traceback logged whole, whatever the run's data in it)."""
    run_id = _begun("database")  # the price first, recorded
    runtime.run_step(run_id, 3)  # the till check

    till = StepCheckpoint.objects.get(run_id=run_id, seq=3)
    assert (till.status, till.retryable, till.attempts) == (StepStatus.FAILED, True, 1)
    assert till.error == "server closed the connection unexpectedly"
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.current_seq, run.batch_last) == (RunStatus.RUNNING, 2, 3)
    assert not [r for r in caplog.records if r.exc_info]


def test_database_trouble_to_the_bound__parks_at_the_batch__retry_gives_a_fresh_budget() -> None:
    run_id = _begun("database")
    bound = limited_agent.troubled_agent.retry.max_attempts
    for _ in range(bound):  # each back-off's message, played at once
        runtime.run_step(run_id, 3)

    run = WorkflowRun.objects.get(pk=run_id)
    gave_up = f"gave up after {bound} attempts: server closed the connection unexpectedly"
    assert run.status == RunStatus.NEEDS_ATTENTION  # never failed: not the member's error
    assert run.error == f"check_till: the database kept failing ({gave_up}); retry once it is back"
    assert (run.current_seq, run.batch_last) == (2, 3)

    durable.retry(run_id, actor="ops", reason="the database is back")

    till = StepCheckpoint.objects.get(run_id=run_id, seq=3)
    assert (till.status, till.attempts) == (StepStatus.FAILED, 0)  # a fresh budget
    runtime.run_step(run_id, 3)
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.RUNNING  # retried again, not parked at once
    assert StepCheckpoint.objects.get(run_id=run_id, seq=3).attempts == 1
