"""A fee waiver's recorded outcome, in both engines' shapes, and what the customer reads of it:
on the status page while it waits and once it is decided (approved, rejected, timed out)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from refunds import policy, progress, waivers, wording

GRANTED = {"waived": True, "waiver_reason": "medical", "fee_cents": 4500, "reply": ""}
#: What an operator typed as their internal reason, and who they are: never told.
INTERNAL = "INTERNAL fraud flag on acct 4411, see ticket OPS-99731"
GRAPH_REJECTED = {"approved": False, "actor": "ops.jane", "reason": INTERNAL, "timed_out": False}
AGENT_REJECTED = {"rejected": True, "reason": INTERNAL, "timed_out": False}
TIMED_OUT = {"approved": False, "actor": "", "reason": "", "timed_out": True}
APPROVED_SORRY = policy.WAIVER_REPLIES["approve"][1]
NO_DOCUMENT = policy.WAIVER_REPLIES["reject"][2]
PLANNED = [
    "load_request",
    "fetch_booking",
    "check_cancellation_policy",
    waivers.STEP,
    "calculate_penalty_fee",
    "charge_customer",
    "cancel_seat",
    "issue_boarding_pass",
    "capture_fee",
    "send_confirmation_email",
]


@dataclass(frozen=True)
class Step:
    seq: int
    name: str
    status: str
    kind: str = "read"
    retryable: bool = False


def done_until(name: str) -> list[Step]:
    index = PLANNED.index(name)
    return [Step(seq, n, "COMPLETED") for seq, n in enumerate(PLANNED[: index + 1], start=1)]


# --- the recorded outcome -------------------------------------------------------------------
def test_outcome_of__approved_waives_the_whole_fee_and_says_the_policys_default() -> None:
    outcome = waivers.outcome_of(GRANTED)
    assert outcome == waivers.Outcome(granted=True)
    assert waivers.waived_cents(GRANTED) == 4500
    assert outcome.customer_line == policy.WAIVER_REPLIES["approve"][0]


@pytest.mark.parametrize("output", [GRAPH_REJECTED, AGENT_REJECTED])
def test_outcome_of__a_rejection_tells_the_policys_sentence_never_the_reason_or_the_name(
    output: dict[str, Any],
) -> None:
    outcome = waivers.outcome_of(output)
    assert outcome == waivers.Outcome(granted=False)
    assert waivers.waived_cents(output) == 0
    assert outcome.customer_line == (
        "Fee waiver: our team couldn't waive the fee, so the standard change fee applies."
    )


@pytest.mark.parametrize(
    ("output", "told"),
    [
        ({**GRANTED, "reply": APPROVED_SORRY}, APPROVED_SORRY),
        ({**GRAPH_REJECTED, "reply": NO_DOCUMENT}, NO_DOCUMENT),
        ({**AGENT_REJECTED, "reply": NO_DOCUMENT}, NO_DOCUMENT),
        # The operator's own words, previewed in the admin, as one paragraph.
        (
            {**GRAPH_REJECTED, "reply": " Please send us\n the certificate. "},
            "Please send us the certificate.",
        ),
        # The other outcome's sentence would say the opposite: the default instead.
        ({**GRAPH_REJECTED, "reply": APPROVED_SORRY}, policy.WAIVER_REPLIES["reject"][0]),
    ],
)
def test_outcome_of__the_decisions_reply_is_what_the_customer_reads(
    output: dict[str, Any], told: str
) -> None:
    outcome = waivers.outcome_of(output)
    assert outcome is not None and outcome.customer_line == told
    assert "ops.jane" not in outcome.customer_line and "OPS-99731" not in outcome.customer_line


def test_outcome_of__a_timeout_is_the_normal_fee_and_says_so() -> None:
    outcome = waivers.outcome_of({**TIMED_OUT, "reply": "anything"})
    assert outcome is not None and outcome.timed_out and not outcome.granted
    assert waivers.waived_cents(TIMED_OUT) == 0
    assert outcome.customer_line == wording.WAIVER_TIMED_OUT


@pytest.mark.parametrize("output", [None, {}, waivers.NOT_REQUESTED, {"ok": True}, "text"])
def test_outcome_of__nothing_asked_or_decided_is_none(output: Any) -> None:
    assert waivers.outcome_of(output) is None
    assert waivers.waived_cents(output) == 0


def test_waived_cents__never_more_than_a_sane_positive_fee() -> None:
    assert waivers.waived_cents({**GRANTED, "fee_cents": -5}) == 0
    assert waivers.waived_cents({**GRANTED, "fee_cents": True}) == 0


# --- the status page ------------------------------------------------------------------------
def test_waiting_for_approval__says_waiting_for_our_team_and_keeps_polling() -> None:
    view = progress.describe(
        status="WAITING",
        current_step=waivers.STEP,
        steps=done_until("check_cancellation_policy"),
        planned=PLANNED,
        awaiting_approval=waivers.STEP,
    )
    assert view.outcome == "awaiting_approval"
    assert not view.final
    assert "waiting for our team" in view.headline
    assert "Nothing on your booking or your card changes" in view.message
    row = next(s for s in view.steps if s.name == waivers.STEP)
    assert (row.state, row.state_label) == ("awaiting", "Waiting for our team")
    assert [s.state for s in view.steps][PLANNED.index(waivers.STEP) + 1 :] == ["pending"] * 6


def test_approved__the_fee_rows_say_waived_not_free_and_the_details_say_so() -> None:
    outputs = {waivers.STEP: GRANTED, "charge_customer": {"authorized": False, "amount_cents": 0}}
    view = progress.describe(
        status="COMPLETED",
        current_step="",
        steps=done_until("send_confirmation_email"),
        planned=PLANNED,
        fee_cents=0,
        outputs=outputs,
    )
    labels = {s.name: s.label for s in view.steps}
    assert labels["charge_customer"] == "Change fee waived: nothing held on your card"
    assert labels[waivers.STEP] == "Our team reviewing your fee waiver request"
    details = progress.outcome_details("COMPLETED", outputs)
    assert "Change fee: none, our team waived it" in details
    assert "Fee waiver: approved by our team, so there is no change fee." in details


def test_rejected__charged_the_fee_and_told_why() -> None:
    outputs = {
        waivers.STEP: GRAPH_REJECTED,
        "charge_customer": {"authorized": True, "amount_cents": 4500},
        "capture_fee": {"captured": True, "amount_cents": 4500},
    }
    details = progress.outcome_details("COMPLETED", outputs)
    assert "Change fee: $45, charged to your card" in details
    assert policy.WAIVER_REPLIES["reject"][0] in details
    assert not any(INTERNAL in line or "ops.jane" in line for line in details)


def test_no_waiver_asked__no_waiver_line() -> None:
    outputs = {waivers.STEP: waivers.NOT_REQUESTED, "charge_customer": {"authorized": False}}
    details = progress.outcome_details("COMPLETED", outputs)
    assert not any(line.startswith("Fee waiver") for line in details)
    assert "Change fee: none for your fare" in details
