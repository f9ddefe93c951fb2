"""The refund as an agent run (`REFUNDS_ENGINE=agent`), played in this process against the
partner sandbox: the same effects as the graph workflow, the owner checked in code before the
model is first asked, and the status page reading it in customer words."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agentflow import _store as store
from agentflow import durable
from agentflow._base.states import RunStatus, StepStatus
from agentflow._engine import runtime
from agentflow.models import StepCheckpoint, WorkflowRun
from agentflow.testing.inprocess import next_batch_member
from refunds import engines
from refunds.sandbox.airline import owner_of
from tests.support.airline_days import new_flight
from tests.support.refunds import submit
from tests.support.sandbox import SandboxProcess

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]


def names(run_id: str) -> list[str]:
    return list(
        StepCheckpoint.objects.filter(run_id=run_id).order_by("seq").values_list("name", flat=True)
    )


def test_agent_engine__rebooks_with_one_of_each_effect_and_the_graph_s_outcome(
    drive: Callable[[str], WorkflowRun], partners: SandboxProcess, settings: Any
) -> None:
    settings.REFUNDS_ENGINE = "agent"
    run_id = submit("AGT001")

    run = drive(run_id, max_steps=80)

    assert run.workflow == engines.AGENT
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output.startswith(f"You're booked on SK1240 on {new_flight().date}, seat ")
    # the owner and the flight first, in code
    assert names(run_id)[:3] == ["verify_ownership", "check_flight", "llm"]
    ledger = partners.ledger(workflow_id=run_id)
    for kind in ("payments", "seat_cancellations", "boarding_passes", "crm_updates", "emails"):
        assert len(ledger[kind]) == 1, kind
    assert ledger["payments"][0]["amount"] == 4500
    assert ledger["refunds"] == []
    assert ledger["emails"][0]["to"] == [owner_of("AGT001").email]


def test_agent_engine__someone_else_s_details__failed_before_the_model_is_asked(
    drive: Callable[[str], WorkflowRun], partners: SandboxProcess, settings: Any
) -> None:
    settings.REFUNDS_ENGINE = "agent"
    run_id = submit("AGT002", last_name="Mallory")

    run = drive(run_id)

    assert run.status == RunStatus.FAILED
    assert run.error == "verify_ownership: These details don't match a booking."
    assert "llm" not in names(run_id)  # no model turn, so no tool either
    ledger = partners.ledger(workflow_id=run_id)
    assert all(ledger[kind] == [] for kind in ("payments", "seat_cancellations", "emails"))
    snapshot = durable.snapshot(run_id)
    assert snapshot is not None and snapshot.status == RunStatus.FAILED


def test_agent_engine__a_fork_sets_the_charge_aside_then_fails__that_charge_refunded_and_told(
    drive: Callable[[str], WorkflowRun], partners: SandboxProcess, settings: Any
) -> None:
    """Issue 19 finding 3: the undo of the set-aside charge (`refund_fee@b0.N`) read "the
    latest charge in the current branch", which had none: `{"refunded": false}` recorded as
    done; `notify_failure` found no booking in the branch and mailed no one. A compensation is
    handed the exact call it undoes, and the customer is found whichever branch found them."""
    settings.REFUNDS_ENGINE = "agent"
    run_id = submit("AGT003")
    charged = StepCheckpoint.objects.filter(
        run_id=run_id, name="charge_customer", status=StepStatus.COMPLETED
    )
    for _ in range(60):
        if charged.exists():
            break
        run = WorkflowRun.objects.get(pk=run_id)
        # read-only calls run at once stay at the batch's first position: play each member
        member = next_batch_member(run_id)
        runtime.run_step(run_id, run.current_seq if member is None else member)
    charge = charged.get()
    assert store.run_park(run_id, charge.seq + 1, "diverged (the prompt changed)", fence=None)
    settings.AGENTFLOW_AGENT_MAX_TURNS = 1  # the new branch runs out of turns before a charge

    durable.fork(run_id, position=2, actor="ops", reason="new prompt")  # after the owner check
    run = drive(run_id)

    assert run.status == RunStatus.FAILED, run.error
    assert f"refund_fee@b0.{charge.seq}" in names(run_id)
    ledger = partners.ledger(workflow_id=run_id)
    [hold] = ledger["authorizations"]  # the charge holds the fee; the undo releases it
    [released] = ledger["authorization_cancels"]
    assert (released["id"], hold["amount"]) == (hold["id"], 4500)
    assert released["idempotency_key"].startswith(f"{run_id}_b1_step_")  # the branch's own key
    assert ledger["payments"] == [] and ledger["refunds"] == []
    [email] = ledger["emails"]
    assert email["to"] == [owner_of("AGT003").email]
