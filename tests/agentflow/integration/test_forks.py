"""Forks of agent runs never repeat or keep money (issue 19 findings 2, 5 and 7,
docs/protocol.md, "Operator actions"): an effect that may have happened is asked of its partner
first, a call on a live worker or an undo under way refuses the fork, compensations are never reused
and their keys name the branch. In this process against real Postgres."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.utils import timezone

from agentflow import _store as store
from agentflow import durable
from agentflow._base.states import RunStatus, StepKind, StepStatus
from agentflow._engine import runtime
from agentflow.models import RunEvent, StepCheckpoint, SupersededStep, WorkflowRun
from tests.support import partner, workflows

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]


def diverge_at(run_id: str, seq: int) -> None:
    """Make the model turn recorded at `seq` differ from what the function now asks."""
    turn = StepCheckpoint.objects.get(run_id=run_id, seq=seq)
    recorded = turn.arguments
    StepCheckpoint.objects.filter(pk=turn.pk).update(
        arguments={
            **recorded,
            "arguments": {**recorded["arguments"], "model": "another model"},
            "digest": "the digest of the turn as another model was asked",
        },
        digest="the digest of the turn as another model was asked",
    )


def test_fork__over_a_buy_whose_answer_was_lost__the_partner_is_asked_and_the_buy_adopted(
    drive: Callable[[str], WorkflowRun],
) -> None:
    """Finding 2: the buy is FAILED retryable after the partner took it; the fork refused only
    IN_PROGRESS effects, so the new branch bought again under `..._b1_step_5`."""
    run_id = durable.start(workflows.careful_agent.name)
    for seq in (1, 2, 3, 4, 5):
        runtime.run_step(run_id, seq)
    bought = durable.idempotency_key(run_id, 5)
    buy = StepCheckpoint.objects.get(run_id=run_id, seq=5)
    assert (buy.status, buy.retryable, partner.effects()[bought]) == (StepStatus.FAILED, True, 1)
    diverge_at(run_id, 4)
    runtime.run_step(run_id, 5)  # the retry's replay diverges
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.NEEDS_ATTENTION

    durable.fork(run_id, position=4, actor="ops", reason="new prompt")
    run = drive(run_id)

    assert run.status == RunStatus.COMPLETED, run.error
    assert partner.effects() == {bought: 1}  # one buy, adopted, never made again
    assert partner.execution_counts(run_id)[(run_id, 5, "buy")] == 1
    set_aside = SupersededStep.objects.get(run_id=run_id, branch=0, seq=5)
    assert set_aside.status == StepStatus.COMPLETED
    assert set_aside.output["result"]["key"] == bought
    assert StepCheckpoint.objects.get(run_id=run_id, seq=5).idempotency_key == bought
    assert RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.RECONCILED, seq=5).exists()


def test_fork__refused_while_any_call_is_running_on_a_live_worker() -> None:
    """Finding 5's fork rule: a model turn in flight would race the new branch."""
    run_id = durable.start(workflows.agent.name)
    for seq in (1, 2, 3):
        runtime.run_step(run_id, seq)
    now = timezone.now()
    StepCheckpoint.objects.create(
        run_id=run_id,
        seq=4,
        name="llm",
        kind=StepKind.LLM,
        status=StepStatus.IN_PROGRESS,
        attempts=1,
        idempotency_key=durable.idempotency_key(run_id, 4),
        lease_owner="a live worker",
        lease_expires_at=now + timedelta(minutes=5),
        first_started_at=now,
        started_at=now,
    )
    assert store.run_park(run_id, 4, "diverged", fence=1)

    with pytest.raises(durable.ActionRefused, match=r"llm \(position 4\) is running on a live"):
        durable.fork(run_id, position=2, actor="ops", reason="x")
    assert WorkflowRun.objects.get(pk=run_id).branch == 0


def test_fork__mid_undo__refused_with_the_reason_and_refunded_once(
    drive: Callable[[str], WorkflowRun],
) -> None:
    """Finding 7: the refund done, the notification failed (parked). A fork used to set the
    undo aside and refund a second time."""
    run_id = durable.start(workflows.agent.name, input={"fail_after_buy": True})
    for seq in (1, 2, 3, 4, 5, 6, 7):  # the function fails at 6, after the buy; refund@5 at 7
        runtime.run_step(run_id, seq)
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.current_seq, run.current_step) == (8, "tell")
    assert store.run_park(
        run_id, 8, "compensation failed: tell: the mail server is down", fence=None
    )

    with pytest.raises(durable.ActionRefused, match=r"its undo has started \(tell is next\)"):
        durable.fork(run_id, position=4, actor="ops", reason="x")

    durable.retry(run_id, actor="ops", reason="mail is back")
    assert drive(run_id).status == RunStatus.FAILED
    refunded = StepCheckpoint.objects.get(run_id=run_id, name="refund@5").idempotency_key
    assert partner.effects()[refunded] == 1


def test_fork__after_a_failure_that_only_told_the_customer__the_told_step_is_not_reused(
    drive: Callable[[str], WorkflowRun],
) -> None:
    """Finding 7: the superseded compensation (no fingerprint) crashed the new branch's replay,
    which failed again and told the customer again under a key without the branch."""
    run_id = durable.start(workflows.agent.name)
    for seq in (1, 2, 3, 4):
        runtime.run_step(run_id, seq)
    assert store.run_fail_between_calls(run_id, workflows.agent, 5, "the shop closed")
    assert drive(run_id).status == RunStatus.FAILED  # tell at 6 (5 is the call's), no undo

    durable.fork(run_id, position=4, actor="ops", reason="the shop is open again")
    run = drive(run_id)

    assert run.status == RunStatus.COMPLETED, run.error
    told = durable.idempotency_key(run_id, 6)
    assert partner.effects() == {told: 1, durable.idempotency_key(run_id, 5, 1): 1}  # tell, buy
    assert StepCheckpoint.objects.get(run_id=run_id, seq=5).name == "buy"


def test_fork__then_failing__each_compensation_key_names_the_branch(
    drive: Callable[[str], WorkflowRun],
) -> None:
    """Finding 7: the branch's undo at position N used `<run>_step_N`, a key branch 0 may have
    used for another call."""
    run_id = durable.start(workflows.agent.name, input={"fail_if_forked": True})
    for seq in (1, 2, 3, 4, 5):
        runtime.run_step(run_id, seq)
    diverge_at(run_id, 4)
    assert drive(run_id).status == RunStatus.NEEDS_ATTENTION
    durable.fork(run_id, position=4, actor="ops", reason="x")

    assert drive(run_id).status == RunStatus.FAILED
    for name in ("refund@b0.5", "tell"):
        undo = StepCheckpoint.objects.get(run_id=run_id, name=name)
        assert undo.idempotency_key == durable.idempotency_key(run_id, undo.seq, 1), name
