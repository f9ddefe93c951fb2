"""Retry policy: attempt number -> back-off delay. Pure, no database."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    #: Attempts in all, the first included; past this a retryable error becomes permanent.
    max_attempts: int = 6
    base_seconds: float = 0.5
    max_seconds: float = 60.0

    def delay_seconds(self, attempt: int, *, rng: random.Random | None = None) -> float:
        """Delay before attempt `attempt + 1`, exponential with equal jitter.

        Equal jitter (half fixed, half random) spreads a thundering herd like full jitter does,
        but never retries at once: a partner that just said 429 gets at least half the delay.
        """
        ceiling = min(self.max_seconds, self.base_seconds * 2 ** max(attempt - 1, 0))
        return ceiling / 2 + (rng or random).uniform(0, ceiling / 2)

    def exhausted(self, attempt: int) -> bool:
        return attempt >= self.max_attempts


DEFAULT_RETRY = RetryPolicy()
