"""The ledger: every real effect the partners made, one entry per effect, plus request counts."""

from __future__ import annotations

import json
from typing import Any

from refunds.sandbox.state import Store

_INTENT_FIELDS = (
    "currency",
    "payment_method",
    "status",
    "capture_method",
    "description",
    "metadata",
)
# Ledger list name -> (effect kinds, fields copied from the partner's answer).
# `payments` is money taken: a charge confirmed at once, or a hold's capture (each under the
# key of the request that took the money; `capture_method` tells which). `authorizations` are
# holds placed (their `status` is the hold's now: requires_capture, succeeded once captured,
# canceled), `authorization_cancels` holds released by a cancel request. Money kept by a run is
# its payments minus its refunds.
LISTS = {
    "payments": (("payment", "capture"), _INTENT_FIELDS),
    "authorizations": (("authorization",), _INTENT_FIELDS),
    "authorization_cancels": (
        ("authorization_cancel",),
        ("currency", "cancellation_reason", "metadata"),
    ),
    "refunds": (("refund",), ("payment_intent", "currency", "status", "reason", "metadata")),
    "seat_cancellations": (("seat_cancellation",), ("reference", "seat", "status")),
    "seat_reinstatements": (
        ("seat_reinstatement",),
        ("reference", "seat", "cancellation_id", "status"),
    ),
    "boarding_passes": (("boarding_pass",), ("reference", "flight", "date", "seat", "barcode")),
    "crm_updates": (("crm_update",), ("reference", "customer_email", "note")),
}
#: Effects on a payment intent, listed under the intent's id (as the money they move is).
_ON_AN_INTENT = frozenset({"capture", "authorization_cancel"})


def ledger(store: Store, *, workflow_id: str | None = None) -> dict[str, Any]:
    """The control endpoint's JSON; with `workflow_id`, every list holds only that workflow's."""
    where, params = ("AND workflow_id = ?", (workflow_id,)) if workflow_id is not None else ("", ())
    result: dict[str, Any] = {}
    for name, (kinds, fields) in LISTS.items():
        rows = store.select(
            f"SELECT * FROM effects WHERE kind IN ({', '.join('?' for _ in kinds)}) {where}"
            " ORDER BY seq",
            (*kinds, *params),
        )
        result[name] = [_entry(row, fields) for row in rows]
    emails = store.select(f"SELECT * FROM emails WHERE 1 = 1 {where} ORDER BY seq", params)
    result["emails"] = [
        {
            "message_id": row["message_id"],
            "idempotency_key": row["message_id"],
            "workflow_id": row["workflow_id"],
            "to": json.loads(row["recipients"]),
            "subject": row["subject"],
            "body": row["body"],
            "created": row["created"],
            "received": row["created"],
            "last_delivery": row["last_delivery"],
            "deliveries": row["deliveries"],
        }
        for row in emails
    ]
    for kind in ("requests", "replays"):
        rows = store.select("SELECT endpoint, n FROM counters WHERE kind = ? ORDER BY 1", (kind,))
        result[kind] = {row["endpoint"]: row["n"] for row in rows}
    result["duplicate_email_deliveries"] = sum(row["deliveries"] - 1 for row in emails)
    in_flight = store.select("SELECT COUNT(*) FROM idempotency_keys WHERE status IS NULL")
    result["in_flight"] = in_flight[0][0]
    return result


def _entry(row: Any, fields: tuple[str, ...]) -> dict[str, Any]:
    body = json.loads(row["body"])
    entry = {
        "id": row["subject"] if row["kind"] in _ON_AN_INTENT else row["id"],
        "idempotency_key": row["idempotency_key"],
        "workflow_id": row["workflow_id"],
        "created": row["created"],
    }
    if row["amount"] is not None:
        entry["amount"] = row["amount"]
    entry.update({field: body.get(field) for field in fields})
    return entry
