"""The refund agent's guardrails, as pure functions of a call and the run's earlier calls."""

from __future__ import annotations

import pytest

from agentflow.agent import ToolRecord, ToolRefused
from agentflow.durable import PermanentStepError
from refunds.agent import guardrails
from refunds.agent.guardrails import GuardrailViolation


def record(position: int, name: str, *, ok: bool = True) -> ToolRecord:
    return ToolRecord(position=position, name=name, arguments={}, result={}, ok=ok)


def test_violations_are_permanent_errors() -> None:
    assert issubclass(GuardrailViolation, PermanentStepError)


def test_charge_amount__must_equal_the_policy_fee() -> None:
    guardrails.check_charge_amount(4500, fee_cents=4500, reference="abc123")
    guardrails.check_charge_amount(0, fee_cents=0, reference="FLX123")
    with pytest.raises(GuardrailViolation) as caught:
        guardrails.check_charge_amount(1, fee_cents=4500, reference="abc123")
    assert str(caught.value) == (
        "We stopped this change: our automated assistant asked to charge $0.01, but the change "
        "fee for booking ABC123 is $45.00, so no charge was made."
    )
    with pytest.raises(GuardrailViolation, match=r"charge \$90\.00"):
        guardrails.check_charge_amount(9000, fee_cents=4500, reference="ABC123")
    with pytest.raises(GuardrailViolation, match=r"fee for booking FLX123 is \$0\.00"):
        guardrails.check_charge_amount(4500, fee_cents=0, reference="FLX123")


def test_own_refund_and_booking__others_are_refused() -> None:
    guardrails.check_own_refund(" rf_1 ", "rf_1")
    guardrails.check_own_booking("abc123 ", "ABC123")
    with pytest.raises(GuardrailViolation, match=r"request 'rf_2', not on this request \(rf_1\)"):
        guardrails.check_own_refund("rf_2", "rf_1")
    with pytest.raises(
        GuardrailViolation,
        match=r"booking XYZ789, which is not the booking of this request \(ABC123\)",
    ):
        guardrails.check_own_booking("xyz789", "abc123")


def test_ready_to_issue__seat_cancelled_and_fee_settled_first() -> None:
    with pytest.raises(ToolRefused, match="call cancel_seat and charge_customer first"):
        guardrails.check_ready_to_issue([record(2, "fetch_booking")])
    with pytest.raises(ToolRefused, match="call charge_customer first"):
        guardrails.check_ready_to_issue(
            [record(4, "cancel_seat"), record(5, "charge_customer", ok=False)]
        )
    guardrails.check_ready_to_issue([record(4, "cancel_seat"), record(5, "charge_customer")])


def test_results_present__names_what_is_missing() -> None:
    with pytest.raises(
        ToolRefused,
        match="send_confirmation_email needs the results of fetch_booking, issue_boarding_pass",
    ):
        guardrails.check_results_present(
            "send_confirmation_email",
            ("load_request", "fetch_booking", "issue_boarding_pass"),
            [record(1, "load_request")],
        )


def test_fee_secured__before_the_seat_is_cancelled() -> None:
    with pytest.raises(ToolRefused, match="call charge_customer first"):
        guardrails.check_fee_secured([record(2, "fetch_booking")])
    with pytest.raises(ToolRefused, match="call charge_customer first"):
        guardrails.check_fee_secured([record(3, "charge_customer", ok=False)])
    guardrails.check_fee_secured([record(3, "charge_customer")])


def test_violations__open_with_a_sentence_for_the_customer() -> None:
    """Finding 4: a guardrail failure reaches the customer in its own words, never as a
    partner outage; the status page and the e-mail show messages that open with "We "."""
    for raises in (
        lambda: guardrails.check_charge_amount(1, fee_cents=4500, reference="ABC123"),
        lambda: guardrails.check_own_refund("rf_2", "rf_1"),
        lambda: guardrails.check_own_booking("xyz789", "abc123"),
    ):
        with pytest.raises(GuardrailViolation) as caught:
            raises()
        assert str(caught.value).startswith(guardrails.STOPPED)
