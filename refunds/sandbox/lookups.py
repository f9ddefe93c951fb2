"""Reads of effects by the idempotency key they were made under, as partners offer them: a
client that lost an answer asks what happened instead of guessing (the engine's reconcile)."""

from __future__ import annotations

import json

from refunds.sandbox.messages import Request, Response, partner_error
from refunds.sandbox.state import Store

#: Path -> the effect kind it lists, for the airline's and the CRM's lookups.
BY_KEY = {
    "/airline/seat-cancellations": "seat_cancellation",
    "/airline/seat-reinstatements": "seat_reinstatement",
    "/airline/boarding-passes": "boarding_pass",
    "/crm/updates": "crm_update",
}


def effects_by_key(store: Store, kind: str, request: Request) -> Response:
    """`{"data": [...]}`: the effect made under `?idempotency_key=` (none, or exactly one)."""
    key = request.query.get("idempotency_key")
    if not key:
        return partner_error(400, "invalid_request", "idempotency_key is required")
    rows = store.select(
        "SELECT body FROM effects WHERE kind = ? AND idempotency_key = ? ORDER BY seq",
        (kind, key),
    )
    return Response(status=200, body={"data": [json.loads(row["body"]) for row in rows]})
