"""The run's event log (docs/protocol.md, "Records", "I6: recorded"): every event is written here,
stamped by the database."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from agentflow._observe import telemetry
from agentflow._store import sql

logger = logging.getLogger("agentflow.store.events")  # the name hosts' LOGGING knows


def event_add(
    run_id: str,
    kind: str,
    detail: str,
    *,
    actor: str = "engine",
    seq: int | None = None,
    data: dict[str, Any] | None = None,
) -> None:
    """Append one event, timed by the database's clock (part of the caller's transaction)."""
    sql.insert(
        sql.EVENTS,
        {
            "run_id": run_id,
            "at": sql.at_now(),
            "kind": str(kind),
            "actor": actor[:150],
            "detail": detail,
            "seq": seq,
            "data": data,
        },
    )
    telemetry.event_recorded(run_id, kind)  # counted on /metrics once this commits


def event_time(value: datetime | None) -> str | None:
    """A time as events store it in `data`: ISO 8601, UTC."""
    return value.isoformat() if value is not None else None
