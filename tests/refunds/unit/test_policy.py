"""The cancellation-policy table: which fares change, for what fee, and which waivers are put
before an operator."""

from __future__ import annotations

import pytest

from refunds.policy import (
    WAIVER_REASONS,
    calculate_penalty_fee,
    format_amount,
    policy_for,
    propose_waiver,
    waiver_reason_words,
)


@pytest.mark.parametrize(
    ("fare_class", "rebookable", "fee_cents"),
    [("standard", True, 4500), ("flex", True, 0), ("basic", False, 0), ("FLEX", True, 0)],
)
def test_policy_for__table_by_fare_class(fare_class: str, rebookable: bool, fee_cents: int) -> None:
    policy = policy_for(fare_class)
    assert (policy.rebookable, policy.fee_cents) == (rebookable, fee_cents)


def test_policy_for__basic_refusal_is_customer_readable() -> None:
    assert policy_for("basic").refusal.startswith("Basic fares can't be changed")


def test_policy_for__unknown_fare_is_refused_not_guessed() -> None:
    policy = policy_for("premium-gold")
    assert not policy.rebookable
    assert "premium-gold" in policy.refusal


def test_calculate_penalty_fee__standard_is_45_dollars() -> None:
    assert calculate_penalty_fee("standard") == {"amount_cents": 4500, "currency": "usd"}
    assert calculate_penalty_fee("flex") == {"amount_cents": 0, "currency": "usd"}


def test_format_amount__dollars_and_cents() -> None:
    assert format_amount(4500) == "$45.00"
    assert format_amount(123456, "eur") == "EUR 1,234.56"


@pytest.mark.parametrize("reason", ["medical", "bereavement"])
def test_propose_waiver__an_allowed_reason_on_a_fee_is_proposed_for_the_whole_fee(
    reason: str,
) -> None:
    proposal = propose_waiver(reason=reason, fare_class="standard")
    assert proposal is not None
    assert (proposal.reason, proposal.fee_cents) == (reason, 4500)
    assert proposal.reason_words == WAIVER_REASONS[reason]


@pytest.mark.parametrize(
    ("reason", "fare_class"),
    [
        ("", "standard"),  # none asked for
        ("bad_weather", "standard"),  # not a reason the policy considers
        ("medical", "flex"),  # nothing to waive
        ("medical", "basic"),  # cannot change at all: the refusal stands
        ("medical", "premium-gold"),  # unknown fare: refused, not waived
    ],
)
def test_propose_waiver__nothing_to_put_before_an_operator(reason: str, fare_class: str) -> None:
    assert propose_waiver(reason=reason, fare_class=fare_class) is None


def test_waiver_reason_words__an_unknown_code_is_shown_as_itself() -> None:
    assert waiver_reason_words("medical").startswith("A medical emergency")
    assert waiver_reason_words("retired_code") == "retired_code"
