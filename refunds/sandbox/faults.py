"""Injected faults per endpoint (latency, errors before execution, dropped answers after it).

Kept in the state file, so a chaos run can arm them from another process and they survive a
sandbox restart. The random draws are the point: the sandbox is the chaos source.
"""

from __future__ import annotations

import random
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
    }
)
MAX_LATENCY_MS = 120_000


@dataclass(frozen=True, kw_only=True)
class FaultPlan:
    """What happens to one request: sleep, answer an error before executing, or drop the answer."""

    latency_ms: int = 0
    error_status: int | None = None
    drop: bool = False


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
                " drop_rate, remaining) VALUES (?, ?, ?, ?, ?, ?)",
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
    return (endpoint, latency_ms, error_rate, error_status, drop_rate, count)


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
        latency_ms = row["latency_ms"]
        if not (error or drop or latency_ms):
            return NO_FAULT
        if row["remaining"] is not None:
            if row["remaining"] <= 1:
                db.execute("DELETE FROM faults WHERE endpoint = ?", (endpoint,))
            else:
                db.execute(
                    "UPDATE faults SET remaining = remaining - 1 WHERE endpoint = ?", (endpoint,)
                )
    return FaultPlan(
        latency_ms=latency_ms, error_status=row["error_status"] if error else None, drop=drop
    )


def describe(store: Store) -> dict[str, Any]:
    """Every armed fault and unknown booking, as the control endpoint shows them."""
    faults = {
        row["endpoint"]: {
            "latency_ms": row["latency_ms"],
            "error_rate": row["error_rate"],
            "error_status": row["error_status"],
            "drop_rate": row["drop_rate"],
            "count": row["remaining"],
        }
        for row in store.select("SELECT * FROM faults ORDER BY endpoint")
    }
    references = [r["reference"] for r in store.select("SELECT * FROM unknown_bookings ORDER BY 1")]
    return {"faults": faults, "unknown_bookings": references}


def clear(store: Store) -> None:
    with store.transaction() as db:
        db.execute("DELETE FROM faults")
        db.execute("DELETE FROM unknown_bookings")


def is_unknown_booking(store: Store, reference: str) -> bool:
    rows = store.select("SELECT 1 FROM unknown_bookings WHERE reference = ?", (reference.upper(),))
    return bool(rows)
