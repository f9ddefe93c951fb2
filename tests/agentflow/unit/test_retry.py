"""Retry policy: back-off delays stay within bounds, are never zero, and are capped."""

from __future__ import annotations

import random

import pytest

from agentflow._base.retry import DEFAULT_RETRY, RetryPolicy


class Extreme(random.Random):
    """Always draws the lowest (or highest) value `uniform` can return."""

    def __init__(self, high: bool) -> None:
        super().__init__(0)
        self.high = high

    def uniform(self, a: float, b: float) -> float:
        return b if self.high else a


@pytest.mark.parametrize("attempt", range(1, 12))
def test_delay__within_equal_jitter_bounds(attempt: int) -> None:
    policy = RetryPolicy(base_seconds=0.5, max_seconds=60.0)
    ceiling = min(60.0, 0.5 * 2 ** (attempt - 1))
    rng = random.Random(attempt)

    for _ in range(200):
        assert ceiling / 2 <= policy.delay_seconds(attempt, rng=rng) <= ceiling


def test_delay__never_zero_even_at_the_lowest_draw() -> None:
    for attempt in range(0, 20):
        assert DEFAULT_RETRY.delay_seconds(attempt, rng=Extreme(high=False)) > 0


def test_delay__grows_exponentially_then_is_capped() -> None:
    policy = RetryPolicy(base_seconds=1.0, max_seconds=10.0)
    top = [policy.delay_seconds(attempt, rng=Extreme(high=True)) for attempt in range(1, 9)]

    assert top[:4] == [1.0, 2.0, 4.0, 8.0]
    assert top[4:] == [10.0] * 4
    assert max(policy.delay_seconds(50, rng=random.Random(i)) for i in range(100)) <= 10.0


def test_delay__jitter_spreads_a_herd() -> None:
    delays = {round(DEFAULT_RETRY.delay_seconds(5, rng=random.Random(i)), 6) for i in range(50)}
    assert len(delays) > 40


def test_exhausted__counts_the_first_attempt() -> None:
    policy = RetryPolicy(max_attempts=3)
    assert [policy.exhausted(attempt) for attempt in (1, 2, 3, 4)] == [False, False, True, True]
