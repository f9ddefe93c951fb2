"""Where a run's trace continues: its first span's context, kept on the run row.

Written once per run and only when tracing is on; read (by `agentflow._observe.telemetry`, from the
row) only for a step message that came without a context (the sweeper's re-publish), so the
step hot path never touches it.
"""

from __future__ import annotations

from agentflow._store import sql


def trace_parent_record(run_id: str, traceparent: str) -> None:
    with sql.cursor() as cur:
        cur.execute(f"UPDATE {sql.RUNS} SET trace_parent = %s WHERE id = %s", [traceparent, run_id])
