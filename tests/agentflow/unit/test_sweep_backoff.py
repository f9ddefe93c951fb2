"""The sweeper's back-off rule (agentflow._sweeps.backoff): pure, so every case is a row."""

from __future__ import annotations

import pytest

from agentflow._sweeps.backoff import grace_seconds


@pytest.mark.parametrize(
    ("unanswered", "expected"),
    [
        (None, 2.0),  # the first ring: one lease, as before the back-off
        (0.0, 2.0),
        (2.0, 4.0),  # rung once a lease ago: the gap doubles
        (6.0, 8.0),
        (14.0, 16.0),
        (250.0, 252.0),
        (299.0, 300.0),  # the cap
        (5000.0, 300.0),
        (-3.0, 2.0),  # a clock step backwards never shortens the gap below a lease
    ],
)
def test_grace__doubles_while_unanswered_up_to_the_cap(
    unanswered: float | None, expected: float
) -> None:
    assert grace_seconds(lease=2.0, unanswered_seconds=unanswered, cap=300.0) == expected


def test_grace__a_cap_below_the_lease__is_the_lease() -> None:
    assert grace_seconds(lease=10.0, unanswered_seconds=50.0, cap=5.0) == 10.0


def test_grace__rings_of_one_message__fall_at_powers_of_two_leases_after_its_publish() -> None:
    """Published at 0 with a lease of 1: rung at 1, 2, 4, 8, 16 ..., so a message that waits
    W seconds in a queue is rung 1 + floor(log2(W)) times (the bound the docs give)."""
    lease, ring, first, rings = 1.0, 1.0, 1.0, []
    while ring <= 64:
        rings.append(ring)
        ring += grace_seconds(lease=lease, unanswered_seconds=ring - first, cap=1000.0)
    assert rings == [1, 2, 4, 8, 16, 32, 64]
