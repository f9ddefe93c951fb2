"""Injected faults per endpoint (latency, errors before execution, dropped answers after it,
reads held until enough are in flight at once).

Kept in the state file, so a chaos run can arm them from another process and they survive a
sandbox restart. The random draws are the point: the sandbox is the chaos source. A barrier is
the opposite: it makes concurrency certain rather than likely (a test that needs two reads at
the partner at the same time arms one instead of a latency a busy machine can outlast).
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any

from refunds.sandbox.state import Store

ENDPOINTS = frozenset(
    {
        "payment_intents.create",
        "payment_intents.retrieve",
        "payment_intents.search",
        "payment_intents.capture",
        "payment_intents.cancel",
        "refunds.create",
        "refunds.list",
        "airline.booking",
        "airline.schedule",
        "airline.cancel_seat",
        "airline.boarding_pass",
        "airline.reinstate_seat",
        "crm.update",
        "seat_cancellation.lookup",
        "boarding_pass.lookup",
        "seat_reinstatement.lookup",
        "crm_update.lookup",
        "llm.chat",
        "smtp",
    }
)
FIELDS = frozenset(
    {
        "endpoint",
        "latency_ms",
        "error_rate",
        "error_status",
        "drop_rate",
        "count",
        "unknown_bookings",
        "barrier",
        "barrier_timeout_ms",
    }
)
MAX_LATENCY_MS = 120_000
#: How long a read waits at a barrier for the others by default: long enough for a worker on a
#: loaded machine to send them, short enough that an engine running them one after the other
#: fails the test's assertion rather than hanging it.
BARRIER_TIMEOUT_MS = 30_000


@dataclass(frozen=True, kw_only=True)
class FaultPlan:
    """What happens to one request: sleep, answer an error before executing, or drop the answer."""

    latency_ms: int = 0
    error_status: int | None = None
    drop: bool = False
    #: Hold the request until this many of its endpoint's are held at once (0: no barrier).
    #: Reads only: they answer no differently for having waited.
    barrier: int = 0
    barrier_timeout_ms: int = 0


NO_FAULT = FaultPlan()


def configure(store: Store, spec: dict[str, Any]) -> None:
    """Arm (or replace) an endpoint's fault and/or add unknown bookings; ValueError if malformed."""
    unknown = set(spec) - FIELDS
    if unknown:
        raise ValueError(f"unknown fault fields: {sorted(unknown)}")
    references = spec.get("unknown_bookings", [])
    if not isinstance(references, list) or not all(isinstance(r, str) for r in references):
        raise ValueError("unknown_bookings must be a list of booking references")
    if "endpoint" not in spec and not references:
        raise ValueError(f"give an endpoint (one of {sorted(ENDPOINTS)}) or unknown_bookings")
    row = _fault_row(spec) if "endpoint" in spec else None
    with store.transaction() as db:
        if row is not None:
            db.execute(
                "INSERT OR REPLACE INTO faults (endpoint, latency_ms, error_rate, error_status,"
                " drop_rate, remaining, barrier, barrier_timeout_ms)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )
        for reference in references:
            db.execute(
                "INSERT OR IGNORE INTO unknown_bookings (reference) VALUES (?)",
                (reference.upper(),),
            )


def _fault_row(spec: dict[str, Any]) -> tuple[Any, ...]:
    endpoint = spec["endpoint"]
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint must be one of {sorted(ENDPOINTS)}, not {endpoint!r}")
    latency_ms = _number(spec, "latency_ms", 0, int, 0, MAX_LATENCY_MS)
    error_rate = _number(spec, "error_rate", 0.0, float, 0, 1)
    error_status = _number(spec, "error_status", 500, int, 400, 599)
    drop_rate = _number(spec, "drop_rate", 0.0, float, 0, 1)
    count = spec.get("count")
    if count is not None:
        count = _number(spec, "count", None, int, 1, 10**9)
    barrier = _number(spec, "barrier", 0, int, 0, 1000)
    barrier_timeout_ms = _number(
        spec, "barrier_timeout_ms", BARRIER_TIMEOUT_MS, int, 0, MAX_LATENCY_MS
    )
    return (
        endpoint,
        latency_ms,
        error_rate,
        error_status,
        drop_rate,
        count,
        barrier,
        barrier_timeout_ms,
    )


def _number(
    spec: dict[str, Any], name: str, default: Any, kind: type, low: float, high: float
) -> Any:
    value = spec.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number")
    if kind is int and value != int(value):
        raise ValueError(f"{name} must be a whole number")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}")
    return kind(value)


def plan(store: Store, endpoint: str) -> FaultPlan:
    """Draw this request's faults; a fault with a count disarms after firing that many times."""
    if not store.select("SELECT 1 FROM faults WHERE endpoint = ?", (endpoint,)):
        return NO_FAULT  # the common case, answered without taking the write lock
    with store.transaction() as db:
        row = db.execute("SELECT * FROM faults WHERE endpoint = ?", (endpoint,)).fetchone()
        if row is None:
            return NO_FAULT
        error = random.random() < row["error_rate"]
        drop = not error and random.random() < row["drop_rate"]
        latency_ms, barrier = row["latency_ms"], row["barrier"]
        if not (error or drop or latency_ms or barrier):
            return NO_FAULT
        if row["remaining"] is not None:
            if row["remaining"] <= 1:
                db.execute("DELETE FROM faults WHERE endpoint = ?", (endpoint,))
            else:
                db.execute(
                    "UPDATE faults SET remaining = remaining - 1 WHERE endpoint = ?", (endpoint,)
                )
    return FaultPlan(
        latency_ms=latency_ms,
        error_status=row["error_status"] if error else None,
        drop=drop,
        barrier=barrier if not error else 0,
        barrier_timeout_ms=row["barrier_timeout_ms"],
    )


def describe(store: Store, barriers: Barriers) -> dict[str, Any]:
    """Every armed fault and unknown booking, and the requests held at barriers right now, as
    the control endpoint shows them."""
    faults = {
        row["endpoint"]: {
            "latency_ms": row["latency_ms"],
            "error_rate": row["error_rate"],
            "error_status": row["error_status"],
            "drop_rate": row["drop_rate"],
            "count": row["remaining"],
            "barrier": row["barrier"],
            "barrier_timeout_ms": row["barrier_timeout_ms"],
        }
        for row in store.select("SELECT * FROM faults ORDER BY endpoint")
    }
    references = [r["reference"] for r in store.select("SELECT * FROM unknown_bookings ORDER BY 1")]
    return {"faults": faults, "unknown_bookings": references, "held": barriers.held()}


class Barriers:
    """Requests held until `parties` of one endpoint are held at once, then all let go together.

    In memory, not in the state file: the requests that meet are this process's threads, and a
    restart ends every request anyway. A request that waits past its deadline answers alone (so
    a broken engine fails its test's assertion instead of hanging it); `release` lets every held
    request go, as clearing the faults does."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._waiting: dict[str, int] = {}
        self._round: dict[str, int] = {}

    def meet(self, endpoint: str, parties: int, timeout_ms: int) -> bool:
        """Hold until `parties` requests of `endpoint` (this one included) are held; False if
        the deadline passed first."""
        with self._changed:
            round_ = self._round.get(endpoint, 0)
            if self._waiting.get(endpoint, 0) + 1 >= parties:
                self._let_go(endpoint)
                return True
            self._waiting[endpoint] = self._waiting.get(endpoint, 0) + 1
            met = self._changed.wait_for(
                lambda: self._round.get(endpoint, 0) != round_, timeout_ms / 1000
            )
            if not met:
                self._waiting[endpoint] -= 1
            return met

    def held(self) -> dict[str, int]:
        with self._changed:
            return {endpoint: n for endpoint, n in sorted(self._waiting.items()) if n}

    def release(self) -> None:
        with self._changed:
            for endpoint in list(self._waiting):
                self._let_go(endpoint)

    def _let_go(self, endpoint: str) -> None:
        self._waiting[endpoint] = 0
        self._round[endpoint] = self._round.get(endpoint, 0) + 1
        self._changed.notify_all()


def clear(store: Store) -> None:
    with store.transaction() as db:
        db.execute("DELETE FROM faults")
        db.execute("DELETE FROM unknown_bookings")


def is_unknown_booking(store: Store, reference: str) -> bool:
    rows = store.select("SELECT 1 FROM unknown_bookings WHERE reference = ?", (reference.upper(),))
    return bool(rows)
