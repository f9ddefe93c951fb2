"""Run and step states in, the customer's words out: every outcome the status page can show."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from refunds import progress, wording

PLANNED = [
    "load_request",
    "parse_flight_details",
    "fetch_booking",
    "check_cancellation_policy",
    "calculate_penalty_fee",
    "cancel_seat",
    "charge_customer",
    "issue_boarding_pass",
    "update_crm",
    "send_confirmation_email",
]


@dataclass(frozen=True)
class Step:
    seq: int
    name: str
    status: str
    kind: str = "effect"
    retryable: bool = False


def done_until(name: str) -> list[Step]:
    """Completed checkpoints for every planned step up to and including `name`."""
    index = PLANNED.index(name)
    return [Step(seq, n, "COMPLETED") for seq, n in enumerate(PLANNED[: index + 1], start=1)]


def describe(status: str, current: str, steps: list[Step], **kwargs) -> progress.Progress:
    return progress.describe(
        status=status, current_step=current, steps=steps, planned=PLANNED, **kwargs
    )


def states(view: progress.Progress) -> list[str]:
    return [s.state for s in view.steps]


def test_new_run__received_with_the_first_step_active() -> None:
    view = describe("PENDING", "load_request", [])
    assert view.outcome == "working"
    assert not view.final
    assert view.headline == "We've received your request"
    assert states(view) == ["active"] + ["pending"] * 9


def test_running__done_then_active_then_waiting() -> None:
    steps = [*done_until("fetch_booking"), Step(4, "check_cancellation_policy", "IN_PROGRESS")]
    view = describe("RUNNING", "check_cancellation_policy", steps)
    assert view.headline == "We're working on your request"
    assert states(view) == ["done"] * 3 + ["active"] + ["pending"] * 6
    assert view.steps[3].label == "Checking the fare rules"
    assert view.steps[3].state_label == "In progress"


def test_running__next_step_queued_without_checkpoint_shows_active() -> None:
    view = describe("RUNNING", "fetch_booking", done_until("parse_flight_details"))
    assert states(view)[:4] == ["done", "done", "active", "pending"]


def test_waiting__failed_attempt_of_the_current_step_is_retrying() -> None:
    steps = [*done_until("cancel_seat"), Step(7, "charge_customer", "FAILED")]
    view = describe("WAITING", "charge_customer", steps)
    assert view.outcome == "working"
    assert view.headline == "This is taking a little longer than usual"
    assert view.steps[6].state == "retrying"
    assert view.steps[6].state_label == "Taking longer than usual, still trying"


def test_completed__all_done() -> None:
    view = describe("COMPLETED", "send_confirmation_email", done_until("send_confirmation_email"))
    assert view.outcome == "completed"
    assert view.final
    assert view.headline == "All done — your new boarding pass is on its way"
    assert states(view) == ["done"] * 10


def test_completed__steps_a_branch_skipped_are_not_done() -> None:
    view = describe("COMPLETED", "calculate_penalty_fee", done_until("calculate_penalty_fee"))
    assert states(view) == ["done"] * 5 + ["skipped"] * 5


def test_undoing__compensation_in_progress_puts_things_right() -> None:
    steps = [
        *done_until("charge_customer"),
        Step(8, "issue_boarding_pass", "FAILED"),
        Step(9, "refund_fee", "IN_PROGRESS"),
    ]
    view = describe("RUNNING", "refund_fee", steps)
    assert view.outcome == "working"
    assert not view.final
    assert view.headline == "Something went wrong, so we're putting things right"
    assert states(view) == ["done"] * 7 + ["failed", "skipped", "skipped", "active"]
    assert view.steps[-1].label == "Giving back the $45 fee"


def test_failed_after_charge__refunded_and_told() -> None:
    steps = [
        *done_until("charge_customer"),
        Step(8, "issue_boarding_pass", "FAILED"),
        Step(9, "refund_fee", "COMPLETED"),
        Step(10, "notify_failure", "COMPLETED"),
    ]
    outputs = {"charge_customer": HELD, "capture_fee": TAKEN, "refund_fee": {"refunded": True}}
    view = describe("FAILED", "notify_failure", steps, fee_cents=4500, outputs=outputs)
    assert view.outcome == "refunded"
    assert view.final
    assert view.headline == "We couldn't complete the change; the $45 fee was refunded"
    assert [s.label for s in view.steps[-2:]] == ["Giving back the $45 fee", "Letting you know"]
    assert states(view)[-2:] == ["done", "done"]
    assert states(view)[7:10] == ["failed", "skipped", "skipped"]


def test_failed_before_charge__nothing_charged_with_the_customer_reason() -> None:
    steps = [
        *done_until("fetch_booking"),
        Step(4, "check_cancellation_policy", "FAILED"),
        Step(5, "notify_failure", "COMPLETED"),
    ]
    reason = "Basic fares can't be changed. Your original booking is unchanged."
    view = describe("FAILED", "notify_failure", steps, reason=reason)
    assert view.outcome == "failed"
    assert view.headline == "We couldn't complete the change"
    assert view.message.startswith(reason)
    assert "You have not been charged" in view.message


def test_failed_with_a_free_change__no_fee_claimed_or_refunded() -> None:
    steps = [
        *done_until("charge_customer"),
        Step(8, "issue_boarding_pass", "FAILED"),
        Step(9, "refund_fee", "COMPLETED"),
        Step(10, "notify_failure", "COMPLETED"),
    ]
    view = describe("FAILED", "notify_failure", steps, fee_cents=0)
    assert view.outcome == "failed"
    assert "You have not been charged" in view.message
    assert view.steps[6].label == "No change fee for your fare"
    assert "$" not in " ".join(s.label for s in view.steps)


def test_failed_charged_but_not_refunded__never_claims_money_back() -> None:
    steps = [*done_until("charge_customer"), Step(8, "issue_boarding_pass", "FAILED")]
    for outputs in ({"charge_customer": HELD}, {"charge_customer": HELD, "capture_fee": TAKEN}):
        view = describe("FAILED", "issue_boarding_pass", steps, outputs=outputs)
        assert view.outcome == "needs_attention"
        assert "refunded" not in view.headline


def test_failed_with_the_hold_released__not_charged_and_says_so() -> None:
    """What happened to the money is read from the outputs, not from which steps completed:
    `refund_fee` completed, but it released a hold, so nothing is claimed as refunded."""
    steps = [
        *done_until("charge_customer"),
        Step(8, "issue_boarding_pass", "FAILED"),
        Step(9, "refund_fee", "COMPLETED"),
        Step(10, "notify_failure", "COMPLETED"),
    ]
    outputs = {"charge_customer": HELD, "refund_fee": {"refunded": False, "hold_released": True}}
    view = describe("FAILED", "notify_failure", steps, fee_cents=4500, outputs=outputs)
    assert view.outcome == "failed"
    assert view.message.startswith("You have not been charged: the hold on your card was released.")
    assert "refunded" not in view.headline


def test_needs_attention__a_person_will_look_and_nothing_is_written_off() -> None:
    steps = [*done_until("cancel_seat"), Step(7, "charge_customer", "IN_PROGRESS")]
    view = describe("NEEDS_ATTENTION", "charge_customer", steps)
    assert view.outcome == "needs_attention"
    assert view.final
    assert view.headline == "A member of our team will look at this"
    assert states(view) == ["done"] * 6 + ["held"] + ["pending"] * 3


def test_cancelled__final_and_stopped() -> None:
    steps = [*done_until("fetch_booking"), Step(4, "check_cancellation_policy", "IN_PROGRESS")]
    view = describe("CANCELLED", "check_cancellation_policy", steps)
    assert view.outcome == "cancelled"
    assert view.final
    assert states(view)[3:5] == ["failed", "skipped"]


def test_failure_reason__only_shown_once_the_change_failed() -> None:
    reason = wording.STEP_TROUBLE["fetch_booking"]
    assert reason not in describe("RUNNING", "fetch_booking", [], reason=reason).message
    failed = describe("FAILED", "fetch_booking", [], reason=reason)
    assert failed.message.startswith(f"{reason} You have not been charged.")


def test_failure_reason__a_text_not_written_for_customers_is_never_shown() -> None:
    view = describe("FAILED", "fetch_booking", [], reason="HTTP 500 from 10.0.0.5 (ticket OPS-1)")
    assert "10.0.0.5" not in view.message and "OPS-1" not in view.message
    assert view.message.startswith(wording.SOMETHING_WRONG)


def test_retried_step__latest_checkpoint_of_a_name_wins() -> None:
    steps = [Step(1, "load_request", "FAILED"), Step(2, "load_request", "COMPLETED")]
    assert describe("RUNNING", "parse_flight_details", steps).steps[0].state == "done"


def test_unknown_step__generic_label_never_the_internal_name() -> None:
    steps = [*done_until("send_confirmation_email"), Step(11, "audit_sync_v2", "IN_PROGRESS")]
    view = describe("RUNNING", "audit_sync_v2", steps)
    assert view.steps[-1].label == wording.GENERIC_LABEL
    assert "audit_sync_v2" not in " ".join(s.label for s in view.steps)


@pytest.mark.parametrize(
    ("cents", "text"), [(4500, "$45"), (4550, "$45.50"), (5, "$0.05"), (0, "$0")]
)
def test_format_fee(cents: int, text: str) -> None:
    assert progress.format_fee(cents) == text


def test_fee__label_follows_the_worked_out_amount() -> None:
    view = describe("RUNNING", "charge_customer", done_until("cancel_seat"), fee_cents=6000)
    assert view.steps[6].label == "Securing the $60 change fee on your card"


def test_every_planned_step_has_a_customer_label() -> None:
    from refunds.workflows import refund

    for name in refund.steps:
        assert name in wording.STEP_LABELS, name


def test_as_json__carries_what_the_script_renders() -> None:
    data = describe("COMPLETED", "", done_until("send_confirmation_email")).as_json()
    assert set(data) == {"outcome", "headline", "message", "final", "steps", "details"}
    assert data["steps"][0] == {
        "name": "load_request",
        "label": "Receiving your request",
        "state": "done",
        "state_label": "Done",
    }


# --- what changed ---------------------------------------------------------------------------
BOOKING = {"flight": "SK100", "date": "2027-02-01", "seat": "12A", "contact_email": "a@b.c"}
HELD = {"authorized": True, "payment_intent_id": "pi_1", "amount_cents": 4500, "currency": "usd"}
TAKEN = {"captured": True, "payment_intent_id": "pi_1", "amount_cents": 4500, "currency": "usd"}
ISSUED = {"flight": "SK1240", "date": "2027-03-16", "seat": "14C"}


def test_date_in_words__iso_dates_read_as_a_person_writes_them() -> None:
    assert progress.date_in_words("2027-03-16") == "Tuesday 16 March 2027"
    assert progress.date_in_words("soon") == "soon"


def test_outcome_details__completed_names_the_new_flight_seat_and_fee_charged() -> None:
    outputs = {
        "fetch_booking": BOOKING,
        "charge_customer": HELD,
        "issue_boarding_pass": ISSUED,
        "capture_fee": TAKEN,
        "send_confirmation_email": {"message_id": "<m>"},
    }
    assert progress.outcome_details("COMPLETED", outputs) == (
        "New flight: SK1240 on Tuesday 16 March 2027",
        "New seat: 14C",
        "Change fee: $45, charged to your card",
        "Confirmation and boarding pass emailed to the address on your booking",
    )


def test_outcome_details__completed_free_change_says_no_fee() -> None:
    outputs = {
        "charge_customer": {"authorized": False, "amount_cents": 0},
        "issue_boarding_pass": ISSUED,
    }
    assert "Change fee: none for your fare" in progress.outcome_details("COMPLETED", outputs)


def test_outcome_details__a_request_not_from_the_owner_reveals_nothing_of_the_booking() -> None:
    details = progress.outcome_details("FAILED", {"notify_failure": {"sent": False}})
    assert details == (
        "Nothing was changed: no booking was touched.",
        "No email was sent about this request.",
    )


def test_outcome_details__failed_before_any_effect_says_the_booking_is_unchanged() -> None:
    outputs = {"fetch_booking": BOOKING, "notify_failure": {"sent": True}}
    assert progress.outcome_details("FAILED", outputs) == (
        "Your booking was not changed: still SK100 on Monday 1 February 2027, seat 12A.",
        "We've emailed the details to the address on your booking.",
    )


def test_outcome_details__failed_after_the_charge_owns_up_to_the_seat_and_the_refund() -> None:
    outputs = {
        "fetch_booking": BOOKING,
        "cancel_seat": {"seat": "12A"},
        "charge_customer": HELD,
        "capture_fee": TAKEN,
        "refund_fee": {"refunded": True},
    }
    assert progress.outcome_details("FAILED", outputs) == (
        "Your original seat 12A on SK100 on Monday 1 February 2027 was released.",
        "The $45 change fee was refunded to your card.",
    )


def test_outcome_details__a_failed_change_gives_the_seat_and_the_hold_back() -> None:
    outputs = {
        "fetch_booking": BOOKING,
        "charge_customer": HELD,
        "cancel_seat": {"seat": "12A"},
        "reinstate_seat": {"reinstated": True, "seat": "12A"},
        "refund_fee": {"refunded": False, "hold_released": True},
    }
    assert progress.outcome_details("FAILED", outputs) == (
        "Your seat 12A on SK100 on Monday 1 February 2027 was released during the change and "
        "has been given back to you: your booking is as it was.",
        "The $45 change fee was only held on your card, and the hold was released: you have "
        "not been charged.",
    )


def test_outcome_details__nothing_while_working() -> None:
    assert progress.outcome_details("RUNNING", {"fetch_booking": BOOKING}) == ()


def test_describe__details_shown_once_final_and_mail_only_claimed_when_sent() -> None:
    steps = [*done_until("parse_flight_details"), Step(3, "fetch_booking", "FAILED")]
    working = describe("RUNNING", "fetch_booking", steps, details=("x",))
    assert working.details == ()
    silent = describe("FAILED", "notify_failure", steps, details=("x",), emailed=False)
    assert silent.details == ("x",)
    assert "emailed" not in silent.message
    assert "We've emailed you" in describe("FAILED", "notify_failure", steps, emailed=True).message


def test_charge_whose_answer_was_lost__a_finished_run_never_says_you_were_not_charged() -> None:
    """Issue 19: the page asks the engine's one predicate; a FAILED retryable charge may have
    taken the money, so neither "cancelled" nor "you have not been charged" is said of it."""
    lost = [*done_until("cancel_seat"), Step(7, "charge_customer", "FAILED", retryable=True)]
    for status in ("FAILED", "CANCELLED"):
        view = describe(status, "charge_customer", lost)
        assert view.outcome == "needs_attention", status
        assert "not been charged" not in view.message

    declined = [*done_until("cancel_seat"), Step(7, "charge_customer", "FAILED")]
    view = describe("FAILED", "charge_customer", declined)
    assert view.outcome == "failed"
    assert "You have not been charged" in view.message
