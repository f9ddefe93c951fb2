"""The CRM partner: one note/update per call, idempotent by key."""

from __future__ import annotations

import secrets
import sqlite3
from typing import Any

from refunds.sandbox.airline import injected
from refunds.sandbox.idempotency import Effect
from refunds.sandbox.messages import Invalid, Request, Response, partner_error
from refunds.sandbox.state import add_effect


def _parse(request: Request) -> dict[str, Any]:
    body = request.json()
    for name in ("customer_email", "reference", "workflow_id"):
        if not isinstance(body.get(name), str) or not body[name]:
            raise Invalid(partner_error(400, "invalid_request", f"{name} is required (a string)"))
    if not isinstance(body.get("note", ""), str):
        raise Invalid(partner_error(400, "invalid_request", "note must be a string"))
    return body


def _execute(db: sqlite3.Connection, params: dict[str, Any], key: str | None) -> Response:
    answer = {
        "update_id": f"crm_{secrets.token_hex(12)}",
        "customer_email": params["customer_email"],
        "reference": params["reference"],
        "note": params.get("note", ""),
        "status": "recorded",
    }
    add_effect(
        db,
        kind="crm_update",
        id=answer["update_id"],
        idempotency_key=key,
        workflow_id=params["workflow_id"],
        subject=params["reference"],
        body=answer,
    )
    return Response(status=200, body=answer)


UPDATE = Effect(
    name="crm.update",
    scope="crm",
    key_required=True,
    parse=_parse,
    execute=_execute,
    injected=injected,
)
