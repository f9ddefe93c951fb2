"""The fee waiver played in this process against the partner sandbox, both engines: what the
operator is asked to approve, nothing touched while it waits, the fee the decision leaves (none,
or the policy's, held and taken once), and a waiver nobody asked for never waits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agentflow import durable
from agentflow._base.states import RunStatus
from agentflow._store import aging
from agentflow.models import WorkflowRun
from agentflow.testing import run_to_end
from refunds import policy, waivers
from tests.support.refunds import holds_left, money_kept, partner_effects, seat_held, submit
from tests.support.sandbox import SandboxProcess

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]

ENGINES = ["graph", "agent"]
DETAILS = "I was admitted to hospital on Sunday and cannot fly this week."


def waiting(run_id: str) -> durable.RunSnapshot:
    found = run_to_end(run_id, retries=False, max_deliveries=80)
    assert found.waiting_for == "approval", (found.status, found.error)
    return found


def the_end(run_id: str) -> durable.RunSnapshot:
    return run_to_end(run_id, max_deliveries=80)


@pytest.mark.parametrize("engine", ENGINES)
def test_waiver__waits_showing_the_customers_reason_with_nothing_touched(
    engine: str, partners: SandboxProcess, settings: Any
) -> None:
    settings.REFUNDS_ENGINE = engine
    run_id = submit(f"WIW{engine[0].upper()}01", waiver_reason="medical", waiver_details=DETAILS)

    found = waiting(run_id)

    assert found.status == RunStatus.WAITING
    pending = found.pending_approval
    assert pending is not None and pending["call"] == waivers.STEP
    arguments = pending["arguments"]
    assert arguments["reason"] == "medical"
    assert arguments["details"] == DETAILS  # both engines show the operator the customer's words
    if engine == "graph":  # and the graph the fee it would waive
        assert arguments["fee_cents"] == 4500
    ledger = partner_effects(partners, run_id)
    for kind in ("authorizations", "payments", "seat_cancellations", "boarding_passes", "emails"):
        assert ledger[kind] == [], kind


@pytest.mark.parametrize("engine", ENGINES)
def test_waiver__approved__no_fee_held_or_taken(
    engine: str, partners: SandboxProcess, settings: Any
) -> None:
    settings.REFUNDS_ENGINE = engine
    run_id = submit(f"WIA{engine[0].upper()}01", waiver_reason="medical", waiver_details=DETAILS)
    waiting(run_id)

    durable.approve(run_id, actor="ops", reason="Get well soon")
    done = the_end(run_id)

    assert done.status == RunStatus.COMPLETED, done.error
    ledger = partner_effects(partners, run_id)
    assert ledger["authorizations"] == [] and ledger["payments"] == []
    assert money_kept(ledger) == 0
    assert len(ledger["boarding_passes"]) == 1 and len(ledger["seat_cancellations"]) == 1
    [email] = ledger["emails"]
    assert "none: our team waived it" in email["body"]


@pytest.mark.parametrize("engine", ENGINES)
def test_waiver__rejected__the_policys_fee_taken_once(
    engine: str, partners: SandboxProcess, settings: Any
) -> None:
    settings.REFUNDS_ENGINE = engine
    run_id = submit(f"WIR{engine[0].upper()}01", waiver_reason="medical", waiver_details=DETAILS)
    waiting(run_id)

    told = policy.WAIVER_REPLIES["reject"][2]
    durable.reject(run_id, actor="ops", reason="No note on file (OPS-1)", reply=told)
    done = the_end(run_id)

    assert done.status == RunStatus.COMPLETED, done.error
    ledger = partner_effects(partners, run_id)
    assert [p["amount"] for p in ledger["payments"]] == [4500]
    assert money_kept(ledger) == 4500 and holds_left(ledger) == []
    [email] = ledger["emails"]
    assert told in " ".join(email["body"].split())  # the policy's sentence the operator chose
    assert "OPS-1" not in email["body"] and "ops" not in email["body"].lower().split()


@pytest.mark.parametrize("engine", ENGINES)
def test_waiver__timed_out__the_policys_fee_and_the_customer_told(
    engine: str, partners: SandboxProcess, settings: Any
) -> None:
    settings.REFUNDS_ENGINE = engine
    run_id = submit(
        f"WIT{engine[0].upper()}01", waiver_reason="bereavement", waiver_details=DETAILS
    )
    waiting(run_id)

    aging.runs_age([run_id], seconds=48 * 3600 + 1)  # by the database's clock
    with pytest.raises(durable.ActionRefused):
        durable.approve(run_id, actor="ops", reason="too late")
    done = the_end(run_id)

    assert done.status == RunStatus.COMPLETED, done.error
    ledger = partner_effects(partners, run_id)
    assert money_kept(ledger) == 4500
    [email] = ledger["emails"]
    assert "couldn't review your request in time" in email["body"]


@pytest.mark.parametrize(
    ("engine", "reference", "reason"),
    [
        ("graph", "WING01", ""),  # none asked for
        ("agent", "WINA01", ""),
        ("graph", "FWIG01", "medical"),  # a flex fare: nothing to waive
        ("agent", "FWIA01", "medical"),
    ],
)
def test_no_waiver_to_consider__never_waits_for_anyone(
    engine: str,
    reference: str,
    reason: str,
    partners: SandboxProcess,
    settings: Any,
    drive: Callable[[str], WorkflowRun],
) -> None:
    settings.REFUNDS_ENGINE = engine
    run_id = submit(reference, waiver_reason=reason, waiver_details=DETAILS if reason else "")

    done = the_end(run_id)

    assert done.status == RunStatus.COMPLETED, done.error
    assert done.waiting_for is None
    assert not [
        s for s in done.steps if s.name == waivers.STEP and s.output != waivers.NOT_REQUESTED
    ]


@pytest.mark.parametrize("engine", ENGINES)
def test_waiver_rejected_then_the_card_declined__nothing_kept_and_both_told(
    engine: str, partners: SandboxProcess, settings: Any
) -> None:
    """The fee path after a rejection can fail like any other: no money kept, the seat never
    touched, and the failure e-mail says what became of the waiver too."""
    settings.REFUNDS_ENGINE = engine
    run_id = submit(f"DEC{engine[0].upper()}W1", waiver_reason="medical", waiver_details=DETAILS)
    waiting(run_id)

    durable.reject(run_id, actor="ops", reason="Not enough detail")  # the policy's default
    done = the_end(run_id)

    assert done.status == RunStatus.FAILED
    ledger = partner_effects(partners, run_id)
    assert money_kept(ledger) == 0 and holds_left(ledger) == []
    assert ledger["seat_cancellations"] == [] and ledger["boarding_passes"] == []
    [email] = ledger["emails"]
    assert "Why: Your card was declined." in email["body"]
    assert policy.WAIVER_REPLIES["reject"][0] in email["body"]
    assert "Not enough detail" not in email["body"]


@pytest.mark.parametrize("engine", ENGINES)
def test_waiver_approved_then_the_pass_refused__no_fee_kept_and_the_seat_given_back(
    engine: str, partners: SandboxProcess, settings: Any
) -> None:
    """I8 after an approval: nothing was held (the fee is 0), the seat released for the change
    is reinstated when the change fails later, and the customer keeps their booking."""
    settings.REFUNDS_ENGINE = engine
    reference = f"WAF{engine[0].upper()}01"
    run_id = submit(reference, waiver_reason="medical", waiver_details=DETAILS)
    waiting(run_id)
    partners.set_fault(endpoint="airline.boarding_pass", error_rate=1.0, error_status=400)

    durable.approve(run_id, actor="ops", reason="Get well soon")
    done = the_end(run_id)

    assert done.status == RunStatus.FAILED, done.error
    ledger = partner_effects(partners, run_id)
    assert money_kept(ledger) == 0 and holds_left(ledger) == []
    assert ledger["authorizations"] == [] and ledger["payments"] == []
    [released] = ledger["seat_cancellations"]
    [back] = ledger["seat_reinstatements"]
    assert back["seat"] == released["seat"]
    assert seat_held(partners, reference)


@pytest.mark.parametrize("engine", ENGINES)
def test_waiver_waiting__cancelled__nothing_to_refund_and_the_seat_still_held(
    engine: str, partners: SandboxProcess, settings: Any
) -> None:
    """Cancel while the waiver waits for an operator: nothing was done, so the run ends
    CANCELLED with nothing to undo, and a late approval is refused."""
    settings.REFUNDS_ENGINE = engine
    reference = f"WAC{engine[0].upper()}01"
    run_id = submit(reference, waiver_reason="medical", waiver_details=DETAILS)
    waiting(run_id)

    durable.cancel(run_id, actor="ops", reason="customer withdrew")
    with pytest.raises(durable.ActionRefused):
        durable.approve(run_id, actor="ops", reason="too late")
    done = the_end(run_id)

    assert done.status == RunStatus.CANCELLED, done.error
    assert done.waiting_for is None
    ledger = partner_effects(partners, run_id)
    for kind in (
        "authorizations",
        "payments",
        "refunds",
        "seat_cancellations",
        "seat_reinstatements",
        "boarding_passes",
    ):
        assert ledger[kind] == [], kind
    assert seat_held(partners, reference)
