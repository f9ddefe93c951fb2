"""The sandbox playing a limited partner: 429 beyond N requests a second or N in flight, as Stripe
or a booking API does, and what it saw (the most requests in any second, the most in flight).

Kept in memory, per sandbox process: the limits are about this server's requests, and the
control endpoint (`/_sandbox/limits`) sets and reads them while it runs.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from refunds.sandbox.messages import Response, partner_error, stripe_error

PARTNERS = ("stripe", "airline", "crm", "llm")
#: A refused request is told to come back after this (Retry-After, seconds).
RETRY_AFTER_SECONDS = 1


def partner_of(path: str) -> str | None:
    """Which partner a request path belongs to (None: the sandbox's own control routes)."""
    if path.startswith("/v1/chat/"):
        return "llm"
    if path.startswith("/v1/"):
        return "stripe"
    for name in ("airline", "crm"):
        if path.startswith(f"/{name}/"):
            return name
    return None


@dataclass
class _Partner:
    rate: int | None = None
    concurrency: int | None = None
    in_flight: int = 0
    most_in_flight: int = 0
    requests: int = 0
    refused: int = 0
    #: Arrival times in the last second (all requests, refused or not) and the most ever.
    arrivals: deque[float] = field(default_factory=deque)
    most_per_second: int = 0
    #: Admitted in the last second, which the rate limits.
    admitted: deque[float] = field(default_factory=deque)
    #: Requests by whole second of arrival (time.time()), for a run's report.
    per_second: dict[int, int] = field(default_factory=dict)


class Throttle:
    """Per-partner limits and counters behind one lock (requests are short to decide)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._partners = {name: _Partner() for name in PARTNERS}

    def configure(self, spec: dict[str, Any]) -> None:
        """`{"stripe": {"rate": 5}, "airline": {"concurrency": 3}}`; None or 0 lifts a limit.
        ValueError if malformed. The counters start again."""
        for name, limits in spec.items():
            if name not in self._partners:
                raise ValueError(f"partner must be one of {list(PARTNERS)}, not {name!r}")
            if not isinstance(limits, dict) or set(limits) - {"rate", "concurrency"}:
                raise ValueError(f'{name}: give {{"rate": N}} and/or {{"concurrency": N}}')
            for key, value in limits.items():
                if value is not None and (
                    isinstance(value, bool) or not isinstance(value, int) or value < 0
                ):
                    raise ValueError(f"{name}.{key} must be a whole number (0: no limit)")
        with self._lock:
            for name, limits in spec.items():
                partner = self._partners[name] = _Partner()
                partner.rate = limits.get("rate") or None
                partner.concurrency = limits.get("concurrency") or None

    @contextmanager
    def request(self, name: str) -> Iterator[Response | None]:
        """Around one request: yields the 429 to answer instead, or None to serve it."""
        now = time.time()
        with self._lock:
            partner = self._partners[name]
            partner.requests += 1
            partner.in_flight += 1
            partner.most_in_flight = max(partner.most_in_flight, partner.in_flight)
            second = int(now)
            partner.per_second[second] = partner.per_second.get(second, 0) + 1
            _trim(partner.arrivals, now)
            partner.arrivals.append(now)
            partner.most_per_second = max(partner.most_per_second, len(partner.arrivals))
            _trim(partner.admitted, now)
            refusal = None
            if partner.concurrency is not None and partner.in_flight > partner.concurrency:
                refusal = "concurrency"
            elif partner.rate is not None and len(partner.admitted) >= partner.rate:
                refusal = "rate"
            if refusal is None:
                partner.admitted.append(now)
            else:
                partner.refused += 1
        try:
            yield None if refusal is None else _too_many(name, refusal)
        finally:
            with self._lock:
                partner.in_flight -= 1

    def report(self) -> dict[str, Any]:
        """Per partner: its limits, requests, 429s, the most in any second and in flight."""
        with self._lock:
            return {
                name: {
                    "rate": p.rate,
                    "concurrency": p.concurrency,
                    "requests": p.requests,
                    "rate_limited": p.refused,
                    "most_per_second": p.most_per_second,
                    "most_in_flight": p.most_in_flight,
                    "per_second": {str(s): n for s, n in sorted(p.per_second.items())},
                }
                for name, p in self._partners.items()
            }


def _trim(window: deque[float], now: float) -> None:
    while window and window[0] <= now - 1.0:
        window.popleft()


def _too_many(name: str, refusal: str) -> Response:
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    if name == "stripe":
        # Stripe names its limiter; a 429 without the header would be a lock, not a limit.
        headers["Stripe-Rate-Limited-Reason"] = f"global-{refusal}"
        response = stripe_error(
            429, "invalid_request_error", "Too many requests", code="rate_limit"
        )
    else:
        response = partner_error(429, "rate_limited", f"too many requests ({refusal})")
    return Response(status=429, body=response.body, headers=headers)
