"""The ledger: every real effect the partners made, one entry per effect, plus request counts."""

from __future__ import annotations

import json
from typing import Any

from refunds.sandbox.state import Store

# Ledger list name -> (effect kind, fields copied from the partner's answer).
LISTS = {
    "payments": ("payment", ("currency", "payment_method", "status", "description", "metadata")),
    "refunds": ("refund", ("payment_intent", "currency", "status", "reason", "metadata")),
    "seat_cancellations": ("seat_cancellation", ("reference", "seat", "status")),
    "boarding_passes": ("boarding_pass", ("reference", "flight", "date", "seat", "barcode")),
    "crm_updates": ("crm_update", ("reference", "customer_email", "note")),
}


def ledger(store: Store, *, workflow_id: str | None = None) -> dict[str, Any]:
    """The control endpoint's JSON; with `workflow_id`, every list holds only that workflow's."""
    where, params = ("AND workflow_id = ?", (workflow_id,)) if workflow_id is not None else ("", ())
    result: dict[str, Any] = {}
    for name, (kind, fields) in LISTS.items():
        rows = store.select(
            f"SELECT * FROM effects WHERE kind = ? {where} ORDER BY seq",
            (kind, *params),
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
        "id": row["id"],
        "idempotency_key": row["idempotency_key"],
        "workflow_id": row["workflow_id"],
        "created": row["created"],
    }
    if row["amount"] is not None:
        entry["amount"] = row["amount"]
    entry.update({field: body.get(field) for field in fields})
    return entry
