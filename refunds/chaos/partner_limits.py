"""Issue 27's scenario in the chaos run: a Stripe that allows N requests a second, Stripe dark for
a while mid-burst, and what the limited partner saw and the runs spent."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from agentflow._limits import rules
from agentflow._limits.store import partner_forget
from agentflow.models import PartnerEvent, StepCheckpoint
from refunds.chaos import evidence as evidence_mod
from refunds.chaos.processes import Sandbox
from refunds.sandbox import faults as sandbox_faults

#: The sandbox endpoints that are Stripe's.
STRIPE_ENDPOINTS = sorted(
    e for e in sandbox_faults.ENDPOINTS if e.split(".")[0] in ("payment_intents", "refunds")
)


def forget(partner_limits: str) -> None:
    """Every partner the run limits starts from nothing: no speed learned by an earlier run,
    no block, no queue (an earlier run's 429s would make this one's look better)."""
    for partner in rules.parse_limits(partner_limits):
        partner_forget(partner)


@contextlib.contextmanager
def stripe_dark(
    sandbox: Sandbox,
    *,
    after: float,
    seconds: float,
    faults: list[dict[str, Any]],
    progress: Callable[[str], None],
) -> Iterator[None]:
    """Every Stripe request answers 503 (before it executes) from `after` s for `seconds`;
    then the run's usual `faults` again."""

    def dark() -> None:
        progress(f"chaos: Stripe goes dark for {seconds:g} s")
        for endpoint in STRIPE_ENDPOINTS:
            spec = {"endpoint": endpoint, "error_rate": 1.0, "error_status": 503}
            sandbox.call("POST", "/_sandbox/faults", spec)

    def back() -> None:
        progress("chaos: Stripe is back")
        sandbox.call("DELETE", "/_sandbox/faults")
        if faults:
            sandbox.arm(faults)

    timers = [threading.Timer(after, dark), threading.Timer(after + seconds, back)]
    for timer in timers:
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        for timer in timers:
            timer.cancel()


def report(
    found: evidence_mod.Evidence, seen: dict[str, Any], t0: float, finished: float
) -> dict[str, Any]:
    """What the limited Stripe saw (the sandbox counts it) and what the runs spent."""
    stripe = seen.get("stripe", {})
    per_second = {int(k): n for k, n in stripe.get("per_second", {}).items()}
    elapsed = max(finished - t0, 1e-9)
    attempts = list(
        StepCheckpoint.objects.filter(
            run_id__in=list(found.runs), name="charge_customer"
        ).values_list("attempts", flat=True)
    )
    busiest = sorted(per_second.values(), reverse=True)
    since = datetime.fromtimestamp(t0, tz=UTC)
    refused = sorted(
        e.timestamp() - t0
        for e in PartnerEvent.objects.filter(
            partner="stripe", kind=PartnerEvent.Kind.RATE_LIMITED
        ).values_list("at", flat=True)
        if e.timestamp() >= t0
    )
    return {
        "stripe_requests": stripe.get("requests", 0),
        "stripe_429s": stripe.get("rate_limited", 0),
        "stripe_most_in_any_second": stripe.get("most_per_second", 0),
        "stripe_busiest_clock_seconds": busiest[:5],
        "stripe_most_in_flight": stripe.get("most_in_flight", 0),
        #: When the 429s came, in seconds from the first submission: they should stop soon.
        "stripe_429_seconds": [round(at, 1) for at in refused[:20]],
        "stripe_requests_per_second_overall": round(stripe.get("requests", 0) / elapsed, 2),
        "partner_events": {
            kind: PartnerEvent.objects.filter(partner="stripe", kind=kind, at__gte=since).count()
            for kind in PartnerEvent.Kind.values
        },
        "charge_attempts_max": max(attempts, default=0),
        "charge_attempts_total": sum(attempts),
    }
