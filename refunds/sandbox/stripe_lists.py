"""Stripe's list endpoints for payment intents and refunds: newest first, `limit` (1-100),
`starting_after` / `ending_before` cursors, `created[gt|gte|lt|lte]` and, for refunds,
`payment_intent`; answered as Stripe's list objects, so the real `stripe` library pages through
them (`auto_paging_iter`). A list is consistent: it shows an object the moment it exists."""

from __future__ import annotations

import json
from typing import Any

from refunds.sandbox.messages import Invalid, Request, Response, stripe_error
from refunds.sandbox.state import Store

#: Effect kinds whose body is a payment intent (a charge, or a hold with its status now).
INTENT_KINDS = ("payment", "authorization")
CREATED_BOUNDS = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
LIST_PARAMS = frozenset(
    {"limit", "starting_after", "ending_before", "payment_intent", "expand[]", "customer"}
    | {f"created[{bound}]" for bound in CREATED_BOUNDS}
)


def list_intents(store: Store, request: Request) -> Response:
    """`GET /v1/payment_intents`."""
    return _listed(store, request, INTENT_KINDS, "/v1/payment_intents", by_intent=False)


def list_refunds(store: Store, request: Request) -> Response:
    """`GET /v1/refunds` (`?payment_intent=` for one intent's)."""
    return _listed(store, request, ("refund",), "/v1/refunds", by_intent=True)


def _listed(
    store: Store, request: Request, kinds: tuple[str, ...], url: str, *, by_intent: bool
) -> Response:
    query = request.query
    for name in query:
        if name not in LIST_PARAMS or (name == "payment_intent" and not by_intent):
            return stripe_error(
                400, "invalid_request_error", f"Received unknown parameter: {name}", param=name
            )
    try:
        limit = _limit(query.get("limit", "10"))
        where, params = _created(query)
    except Invalid as bad:
        return bad.response
    sql = f"SELECT id, body FROM effects WHERE kind IN ({', '.join('?' for _ in kinds)})"
    args: list[Any] = [*kinds]
    if by_intent and query.get("payment_intent"):
        sql += " AND subject = ?"
        args.append(query["payment_intent"])
    sql += where
    args += params
    rows = store.select(f"{sql} ORDER BY seq DESC", tuple(args))
    ids = [row["id"] for row in rows]
    start, end = 0, len(rows)
    for cursor, after in (("starting_after", True), ("ending_before", False)):
        if cursor in query:
            if query[cursor] not in ids:
                return stripe_error(
                    400,
                    "invalid_request_error",
                    f"No such object: '{query[cursor]}'",
                    code="resource_missing",
                    param=cursor,
                )
            at = ids.index(query[cursor])
            start, end = (at + 1, len(rows)) if after else (max(at - limit, 0), at)
    page = rows[start:end][:limit]
    body = {
        "object": "list",
        "data": [json.loads(row["body"]) for row in page],
        "has_more": start + len(page) < end,
        "url": url,
    }
    return Response(status=200, body=body)


def _limit(raw: str) -> int:
    if not (raw.isdigit() and 1 <= int(raw) <= 100):
        raise Invalid(
            stripe_error(400, "invalid_request_error", "limit must be 1..100", param="limit")
        )
    return int(raw)


def _created(query: dict[str, str]) -> tuple[str, list[int]]:
    """`created[gte]=...` and the like: seconds since the epoch, as the body's `created`."""
    where, params = "", []
    for bound, operator in CREATED_BOUNDS.items():
        raw = query.get(f"created[{bound}]")
        if raw is None:
            continue
        if not raw.isdigit():
            raise Invalid(
                stripe_error(
                    400, "invalid_request_error", "Invalid integer: created", param="created"
                )
            )
        where += f" AND json_extract(body, '$.created') {operator} ?"  # fixed operators only
        params.append(int(raw))
    return where, params


def forget(store: Store, body: Any) -> Response:
    """`POST /_sandbox/forget {"id": "pi_..."}`: the payment intent (or refund) is gone from
    Stripe's side, with its capture or cancel, as if it had never been made: a test of a
    reconciliation makes "a run without its payment" this way."""
    target = body.get("id") if isinstance(body, dict) else None
    if not isinstance(target, str) or not target:
        return Response(status=400, body={"error": 'send {"id": "<the object id>"}'})
    with store.transaction() as db:
        gone = db.execute(
            "DELETE FROM effects WHERE id = ?"
            " OR (subject = ? AND kind IN ('capture', 'authorization_cancel'))",
            (target, target),
        ).rowcount
    return Response(status=200, body={"forgotten": gone})
