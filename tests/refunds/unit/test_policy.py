"""The cancellation-policy table: which fares change, and for what fee."""

from __future__ import annotations

import pytest

from refunds.policy import calculate_penalty_fee, format_amount, policy_for


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


def test_calculate_penalty_fee__standard_is_the_specs_45_dollars() -> None:
    assert calculate_penalty_fee("standard") == {"amount_cents": 4500, "currency": "usd"}
    assert calculate_penalty_fee("flex") == {"amount_cents": 0, "currency": "usd"}


def test_format_amount__dollars_and_cents() -> None:
    assert format_amount(4500) == "$45.00"
    assert format_amount(123456, "eur") == "EUR 1,234.56"
