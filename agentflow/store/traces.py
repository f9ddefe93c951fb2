"""Where a run's trace continues: its first span's context, kept on the run row.

Written once per run and only when tracing is on; read only for a step message that came
without a context (the sweeper's re-publish), so the step hot path never touches it.
"""

from __future__ import annotations

from agentflow.store import sql


def trace_parent_record(run_id: str, traceparent: str) -> None:
    with sql.cursor() as cur:
        cur.execute(f"UPDATE {sql.RUNS} SET trace_parent = %s WHERE id = %s", [traceparent, run_id])


def trace_parent_read(run_id: str) -> str:
    row = sql.fetch_one(f"SELECT trace_parent FROM {sql.RUNS} WHERE id = %s", [run_id])
    return str(row[0]) if row and row[0] else ""
