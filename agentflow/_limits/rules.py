"""The rules of partner limits (docs/partner-limits.md, "What happens"), where what they decide is
decided: a partner's configured limit, how fast its key runs after a 429 or a reopened breaker,
and how its breaker moves. Pure: no database, no clock. `agentflow._limits.store` applies them
under the partner's row lock with the database's time.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from agentflow._base import identifiers
from agentflow._conf import settings

#: After a 429 the key runs at half what it ran at, never below this share of its limit: slow
#: enough to stop the 429s of a partner that halved its own limit, and it still moves.
FLOOR_FACTOR = 0.1
#: After a 429 the key climbs back no higher than this share of the speed it had then, for a
#: while (CEILING_HOLD_RECOVERIES recovery times since that 429): the partner's limit, learned,
#: so the 429s stop instead of coming back each time the key recovers.
CEILING_FACTOR = 0.9
CEILING_HOLD_RECOVERIES = 10
#: A breaker that closes starts its partner at this share of the limit (a slow start).
RAMP_START_FACTOR = 0.1
#: A refused probe doubles the time to the next one, up to this.
MAX_COOLDOWN_SECONDS = 60.0
#: A 429 that names no time blocks the key this long.
DEFAULT_BLOCK_SECONDS = 1.0
#: A turn this close is slept for in the worker: a round trip through the broker costs more.
SLEEP_IN_PROCESS_SECONDS = 0.25
#: A step that waits for a turn it reserved is published again this much before the turn, and
#: sleeps the rest in the worker: the broker's and the worker's delay must not make it miss
#: the turn (a step more than an interval late takes the key's next one; its own went unused).
ARRIVE_EARLY_SECONDS = 0.1
#: Spacing of runs resumed after a breaker or a pause on a partner without a rate.
UNRATED_RESUME_SPACING_SECONDS = 0.05

#: The partner tables' key column holds this many characters.
PARTNER_KEY_MAX_CHARS = 100

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*$")
_PERIOD_SECONDS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60}
_PERIOD_SECONDS |= {"h": 3600, "hour": 3600}


@dataclass(frozen=True, kw_only=True)
class Limit:
    """One partner's limit as configured: calls per second and/or calls in flight at once."""

    partner: str
    rate_per_second: float | None = None
    concurrency: int | None = None
    #: The configured text ("25/s"), for pages.
    rate_text: str = ""


class LimitsError(ValueError):
    """AGENTFLOW_PARTNER_LIMITS is malformed (the message says where)."""


def parse_rate(text: str) -> float:
    """`"25/s"`, `"600/m"`, `"1000/h"` -> calls per second."""
    match = _RATE.match(text) if isinstance(text, str) else None
    if match is None:
        raise LimitsError(f'a rate is "N/s", "N/m" or "N/h", not {text!r}')
    count = float(match.group(1))
    if count <= 0:
        raise LimitsError(f"a rate must be above zero, not {text!r}")
    return count / _PERIOD_SECONDS[match.group(2)]


def parse_limits(value: Any) -> dict[str, Limit]:
    """The setting (a dict, or its JSON text) as limits by partner key; LimitsError if bad."""
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise LimitsError(f"AGENTFLOW_PARTNER_LIMITS is not JSON: {exc}") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise LimitsError("AGENTFLOW_PARTNER_LIMITS maps partner keys to their limits")
    limits = {}
    for partner, spec in value.items():
        refused = identifiers.problem("partner key", partner, max_chars=PARTNER_KEY_MAX_CHARS)
        if refused:
            raise LimitsError(f"AGENTFLOW_PARTNER_LIMITS: {refused}")
        if not isinstance(spec, dict) or set(spec) - {"rate", "concurrency"}:
            raise LimitsError(
                f'{partner}: give {{"rate": "N/s"}} and/or {{"concurrency": N}}, not {spec!r}'
            )
        rate = spec.get("rate")
        concurrency = spec.get("concurrency")
        if concurrency is not None and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
        ):
            raise LimitsError(
                f"{partner}: concurrency is a whole number from 1, not {concurrency!r}"
            )
        try:
            per_second = parse_rate(rate) if rate is not None else None
        except LimitsError as exc:
            raise LimitsError(f"{partner}: {exc}") from None
        limits[partner] = Limit(
            partner=partner,
            rate_per_second=per_second,
            concurrency=concurrency,
            rate_text=rate or "",
        )
    return limits


_cache: tuple[Any, dict[str, Limit]] | None = None


def configured() -> dict[str, Limit]:
    """The limits in force, parsed once per value of the setting (tests override it)."""
    global _cache
    raw = settings.AGENTFLOW_PARTNER_LIMITS
    key = json.dumps(raw, sort_keys=True) if not isinstance(raw, str) else raw
    if _cache is None or _cache[0] != key:
        _cache = (key, parse_limits(raw))
    return _cache[1]


def limit_for(partner: str) -> Limit | None:
    """The partner's limit, or None: a partner nobody named is not limited and costs nothing."""
    return configured().get(partner)


# --- the key's speed ----------------------------------------------------------------------------
def speed(*, floor: float, since: float, now: float, ceiling: float = 1.0) -> float:
    """The share of its limit a key runs at: from `floor` at `since` back up linearly over
    AGENTFLOW_PARTNER_RECOVERY_SECONDS (a slowed key, or one whose breaker closed), to at most
    `ceiling` (learned from a 429) until that is held long enough, then on to 1."""
    recovery = float(settings.AGENTFLOW_PARTNER_RECOVERY_SECONDS)
    if (floor >= 1.0 and ceiling >= 1.0) or recovery <= 0:
        return 1.0
    elapsed = max(0.0, now - since)
    climbed = min(1.0, floor + elapsed * (1.0 - floor) / recovery)
    held = recovery * CEILING_HOLD_RECOVERIES
    if ceiling < 1.0:
        lifted = ceiling + max(0.0, elapsed - held) * (1.0 - ceiling) / recovery
        climbed = min(climbed, lifted)
    return min(1.0, climbed)


def ceiling_after(share_now: float, accepted: float | None = None) -> float:
    """The most a key climbs back to after a 429 at `share_now` (for a while): below that, and
    below what the partner was seen to accept in the last second (`accepted`, a share of the
    limit; None when too few calls went to tell)."""
    seen = share_now if accepted is None else min(share_now, accepted)
    return max(FLOOR_FACTOR, seen * CEILING_FACTOR)


def interval_seconds(limit: Limit, share: float) -> float:
    """Seconds between two calls at `share` of the limit (0 without a rate)."""
    if limit.rate_per_second is None:
        return 0.0
    return 1.0 / (limit.rate_per_second * max(share, FLOOR_FACTOR / 2))


def respace_interval(limit: Limit, floor: float) -> float:
    """Spacing of the turns reserved when a 429 slowed the key: at its floor (the slowest it
    runs until it climbs back), so none is moved sooner than it was; a partner without a rate
    resumes its waiters a little apart."""
    if limit.rate_per_second is None:
        return UNRATED_RESUME_SPACING_SECONDS
    return interval_seconds(limit, floor)


def slowed(share_now: float, accepted: float | None = None) -> float:
    """The speed after a 429: half of what it ran at, and no faster than the partner was seen
    to accept in the last second (`accepted`, a share of the limit, when known), never below
    the floor."""
    speed = share_now / 2 if accepted is None else min(share_now / 2, accepted * CEILING_FACTOR)
    return max(FLOOR_FACTOR, speed)


#: Calls given in the last second that tell what the partner accepts (fewer tell nothing).
ACCEPTED_MIN_CALLS = 3


def accepted_share(limit: Limit, *, given: int, refused: int, seconds: float) -> float | None:
    """What the partner accepted of the calls given in the last `seconds`, as a share of the
    limit (None: too few calls to tell, or no rate)."""
    if limit.rate_per_second is None or given < ACCEPTED_MIN_CALLS or seconds <= 0:
        return None
    return max(0.0, given - refused) / seconds / limit.rate_per_second


def block_seconds(exc: Any) -> float:
    """How long a 429 blocks the key: what the partner said (Retry-After, or when its window
    resets), else a second; never past AGENTFLOW_MAX_BACKOFF."""
    asked = [getattr(exc, "retry_after_seconds", None), getattr(exc, "reset_seconds", None)]
    told = [float(a) for a in asked if isinstance(a, int | float) and math.isfinite(a) and a >= 0]
    seconds = max(told) if told else DEFAULT_BLOCK_SECONDS
    return min(seconds, float(settings.AGENTFLOW_MAX_BACKOFF))


# --- the breaker --------------------------------------------------------------------------------
CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


def cooldown_seconds(opened_times: int) -> float:
    """Time from opening (or a refused probe) to the next probe: the setting, doubled for each
    probe refused since, up to a minute."""
    base = float(settings.AGENTFLOW_BREAKER_COOLDOWN_SECONDS)
    return min(MAX_COOLDOWN_SECONDS, base * 2 ** max(opened_times - 1, 0))


def trips(failures: int) -> bool:
    """Do this many consecutive timeouts, 5xx or connection errors open the breaker?"""
    threshold = int(settings.AGENTFLOW_BREAKER_FAILURES)
    return threshold > 0 and failures >= threshold
