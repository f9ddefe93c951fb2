"""What a partner's rate-limit headers say, read once for every gateway: `Retry-After`, Stripe's
`Stripe-Rate-Limited-Reason`, an LLM provider's `x-ratelimit-*`
(docs/partner-limits.md, "What happens"). Pure."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

#: OpenAI's reset durations: "6m0s", "1s", "20ms", "1h2m3.5s".
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True, kw_only=True)
class RateSignal:
    """A partner's own word on its limit, from one answer's headers."""

    retry_after_seconds: float | None = None
    #: Stripe-Rate-Limited-Reason (global-rate, endpoint-concurrency, ...), else "".
    reason: str = ""
    #: x-ratelimit-remaining-requests: calls left in the partner's window.
    remaining: int | None = None
    #: x-ratelimit-reset-requests: seconds until that window resets.
    reset_seconds: float | None = None

    @property
    def exhausted(self) -> bool:
        """The partner says its window has no call left: wait for its reset."""
        return self.remaining is not None and self.remaining <= 0


def read(headers: Mapping[str, Any] | None, *, now: float | None = None) -> RateSignal:
    """The signal in `headers` (any mapping; names compared without case)."""
    if not headers:
        return RateSignal()
    lower = {str(name).lower(): value for name, value in headers.items()}
    retry_after = _retry_after(lower, now)
    remaining = _int(lower.get("x-ratelimit-remaining-requests"))
    reset = duration_seconds(lower.get("x-ratelimit-reset-requests"))
    return RateSignal(
        retry_after_seconds=retry_after,
        reason=str(lower.get("stripe-rate-limited-reason") or "").strip()[:100],
        remaining=remaining,
        reset_seconds=reset,
    )


def _retry_after(lower: dict[str, Any], now: float | None) -> float | None:
    milliseconds = _float(lower.get("retry-after-ms"))
    if milliseconds is not None:
        return milliseconds / 1000
    value = lower.get("retry-after")
    seconds = _float(value)
    if seconds is not None or value is None:
        return seconds
    try:  # an HTTP date
        when = parsedate_to_datetime(str(value)).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if now is None:
        now = time.time()
    return max(0.0, when - now)


def duration_seconds(value: Any) -> float | None:
    """`"6m0s"` -> 360.0; a plain number is seconds; None if unreadable."""
    if value is None:
        return None
    plain = _float(value)
    if plain is not None:
        return plain
    text = str(value).strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)


def _float(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _int(value: Any) -> int | None:
    number = _float(value)
    return int(number) if number is not None else None
