"""Time moved on under live runs, for tests (`agentflow.testing`, the model-based test): every
time a run holds moved into the past by the database's clock, nothing else changed."""

from __future__ import annotations

from django.db import connection

from agentflow.models import RunWait, StepCheckpoint, WorkflowRun

_AGED = {
    WorkflowRun: ("id", ("wake_at", "created_at", "updated_at")),
    StepCheckpoint: (
        "run_id",
        ("lease_expires_at", "retry_at", "first_started_at", "started_at", "finished_at"),
    ),
    RunWait: ("run_id", ("requested_at", "deadline", "resolved_at")),
}


def runs_age(run_ids: list[str], *, seconds: float) -> None:
    """Move every time of these runs and their checkpoints `seconds` into the past, as if that
    long had passed by the database's clock: leases run out, retries and wake-ups fall due,
    first attempts grow older. Nothing else changes (no fence, no status)."""
    if not run_ids:
        return
    with connection.cursor() as cursor:
        for model, (key, columns) in _AGED.items():
            moved = ", ".join(f"{c} = {c} - %s * interval '1 second'" for c in columns)
            cursor.execute(
                f"UPDATE {model._meta.db_table} SET {moved} WHERE {key} = ANY(%s)",
                [*([seconds] * len(columns)), list(run_ids)],
            )
