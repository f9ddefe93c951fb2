"""Synthetic engine rows for the measurements (`bench`, `bench_admin`): a finished history,
due and mixed runs, aged runs for the purge, old events, and the hand-written yardstick's writes.

None of these is a run of the protocol: they are bulk-inserted (Postgres only) to give the
measured queries the data a busy deployment holds. They live with the bench, outside the wheel:
the one writer of engine rows besides agentflow/_store, and named so in the import contracts and
tests/agentflow/unit/test_layers.py. SQL expressions passed in (`wake_at`, `created_at`, `at`)
come from the bench's own constants, never from input, and may use `g`, the row's number.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import connection
from django.db.models import Model
from django.utils import timezone

from agentflow._base.states import RunStatus, StepKind, StepStatus
from agentflow._store import sql
from agentflow.models import RunEvent, StepCheckpoint, WorkflowRun

_RUNS_INSERT = """
INSERT INTO {table} (id, workflow, version, input, status, current_step, current_seq, output,
                     error, business_key, compensations, wake_at, created_at, updated_at)
SELECT %(prefix)s || lpad(g::text, 12, '0'), %(workflow)s, 1, '{{}}'::jsonb, %(status)s,
       %(step)s, %(seq)s, NULL, '', NULL, '[]'::jsonb, {wake_at}, {created_at}, {created_at}
FROM generate_series(%(first)s, %(last)s) AS g
ON CONFLICT (id) DO NOTHING
"""

_EVENTS_INSERT = """
INSERT INTO {table} (run_id, at, kind, actor, detail, seq, data)
SELECT %(prefix)s || lpad((1 + g %% %(runs)s)::text, 12, '0'), {at},
       (%(kinds)s::text[])[1 + g %% %(kind_count)s], 'engine', %(detail)s, 3, '{{}}'::jsonb
FROM generate_series(1, %(count)s) AS g
"""


def runs_insert(
    *,
    prefix: str,
    workflow: str,
    status: str,
    first: int,
    last: int,
    at_step: tuple[str, int],
    wake_at: str,
    created_at: str,
) -> int:
    """Runs `prefix` + the zero-padded numbers `first`..`last`, without checkpoints; ids that
    exist are skipped (a partly present history is completed, not duplicated). Returns how
    many were inserted."""
    step, seq = at_step
    sql = _RUNS_INSERT.format(
        table=WorkflowRun._meta.db_table, wake_at=wake_at, created_at=created_at
    )
    params: dict[str, Any] = {
        "prefix": prefix,
        "workflow": workflow,
        "status": status,
        "step": step,
        "seq": seq,
        "first": first,
        "last": last,
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def events_insert(
    *, prefix: str, runs: int, count: int, at: str, kinds: list[str], detail: str
) -> None:
    """`count` events spread over the runs `prefix` + 1..`runs`, cycling through `kinds`."""
    sql = _EVENTS_INSERT.format(table=RunEvent._meta.db_table, at=at)
    params: dict[str, Any] = {
        "prefix": prefix,
        "runs": runs,
        "count": count,
        "kinds": kinds,
        "kind_count": len(kinds),
        "detail": detail,
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def finished_template(*, workflow: str, steps: int, events: int) -> str:
    """One finished run with `steps` completed checkpoints and `events` events, written by the
    ORM so that every column gets its model default, whatever columns are added later: the
    template `runs_clone` copies."""
    now = timezone.now()
    run = WorkflowRun.objects.create(
        workflow=workflow,
        version=1,
        status=RunStatus.COMPLETED,
        current_step="",
        current_seq=steps + 1,
        output={"done": True},
    )
    StepCheckpoint.objects.bulk_create(
        StepCheckpoint(
            run=run,
            seq=seq,
            name=f"step_{seq}",
            kind=StepKind.READ,
            status=StepStatus.COMPLETED,
            idempotency_key=f"{run.id}_step_{seq}",
            output={"step": f"step_{seq}", "seq": seq},
            first_started_at=now,
            started_at=now,
            finished_at=now,
        )
        for seq in range(1, steps + 1)
    )
    RunEvent.objects.bulk_create(
        RunEvent(run=run, kind=RunEvent.Kind.SWEEP_REQUEUE, actor="sweeper", detail="aged")
        for _ in range(events)
    )
    return run.id


def runs_clone(template: str, *, prefix: str, epoch: Any, first: int, last: int) -> None:
    """Copies of the template run with its checkpoints and events, as runs `prefix` + the
    zero-padded numbers `first`..`last`, created one second apart from `epoch`."""
    run_id = "%(prefix)s || lpad(g::text, 12, '0')"
    created = "%(epoch)s::timestamptz + g * interval '1 second'"
    params = {"prefix": prefix, "epoch": epoch, "first": first, "last": last}
    _clone(
        WorkflowRun,
        "id",
        template,
        {"id": run_id, "created_at": created, "updated_at": created},
        params,
    )
    key = f"{run_id} || '_step_' || t.seq"
    _clone(StepCheckpoint, "run_id", template, {"run_id": run_id, "idempotency_key": key}, params)
    _clone(RunEvent, "run_id", template, {"run_id": run_id}, params)


def _clone(
    model: type[Model], key: str, template: str, changed: dict[str, str], params: dict[str, Any]
) -> None:
    """INSERT … SELECT the template's rows of `model` once per g, with `changed` columns
    computed; an auto-increment primary key is left to its sequence."""
    columns = [
        field.column
        for field in model._meta.concrete_fields
        if field.column in changed or not field.primary_key
    ]
    values = [changed.get(column, f"t.{column}") for column in columns]
    table = model._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(values)} "
            f"FROM {table} t, generate_series(%(first)s, %(last)s) g "
            f"WHERE t.{key} = %(template)s",
            {**params, "template": template},
        )


# --- the hand-written durable chain (the bench's yardstick) ----------------------------------
def yardstick_run_create(workflow: str) -> str:
    """The yardstick chain's run row: one plain ORM commit, as a hand-written chain would."""
    run = WorkflowRun.objects.create(
        workflow=workflow, version=1, status=RunStatus.COMPLETED, current_seq=0
    )
    return run.id


def yardstick_step_record(run_id: str, seq: int) -> None:
    """One link of the yardstick: two plain ORM commits (record the step, then advance the
    run), with none of the claim, fencing, lease, retry or recovery of the protocol."""
    now = timezone.now()
    StepCheckpoint.objects.create(
        run_id=run_id,
        seq=seq,
        name=f"step_{seq}",
        kind=StepKind.READ,
        status=StepStatus.COMPLETED,
        idempotency_key=f"{run_id}_{seq}",
        first_started_at=now,
        started_at=now,
        finished_at=now,
    )
    WorkflowRun.objects.filter(pk=run_id).update(current_seq=seq + 1, updated_at=now)


def floor_run_create(workflow: str) -> str:
    """The protocol floor's run row, RUNNING at its first step (one plain ORM commit)."""
    run = WorkflowRun.objects.create(
        workflow=workflow,
        version=1,
        status=RunStatus.RUNNING,
        current_step="step_1",
        current_seq=1,
        wake_at=timezone.now() + timedelta(minutes=1),
    )
    return run.id


def floor_step(run_id: str, seq: int, *, effect: bool, last: bool) -> None:
    """One step of the protocol floor: only the writes docs/protocol.md, "One step, in order"
    requires of a step, through the engine's own statement, with nothing around them (no load of the
    run, no decisions, no telemetry). A `read` is its completing write; an `effect` its claim,
    committed and flushed before the call, then its fenced completion. Both commit as the engine's
    do: the completion that ends the run waits for the disk, earlier completions do not."""
    checkpoint = {
        "run_id": run_id,
        "seq": seq,
        "name": f"step_{seq}",
        "kind": StepKind.EFFECT if effect else StepKind.READ,
        "idempotency_key": f"{run_id}_{seq}",
        "retryable": False,
        "error": "",
        "lease_owner": "",
        "attempts": 1,
        "fence": 1,
        "first_started_at": sql.at_now(),
        "started_at": sql.at_now(),
    }
    advance: dict[str, Any] = {"current_seq": seq + 1, "updated_at": sql.at_now()}
    if last:
        advance.update(status=RunStatus.COMPLETED, wake_at=None)
    else:
        advance.update(current_step=f"step_{seq + 1}")
    finished = {"status": StepStatus.COMPLETED, "finished_at": sql.at_now()}
    if not effect:
        sql.move_run_and_step(
            run_id=run_id,
            seq=seq,
            active=(RunStatus.RUNNING,),
            run_changes=advance,
            step_insert={**checkpoint, **finished},
            synchronous=last,
        )
        return
    claimed = sql.move_run_and_step(
        run_id=run_id,
        seq=seq,
        active=(RunStatus.RUNNING,),
        run_changes={"wake_at": sql.at_now_plus(60), "updated_at": sql.at_now()},
        step_insert={
            **checkpoint,
            "status": StepStatus.IN_PROGRESS,
            "lease_owner": "floor",
            "lease_expires_at": sql.at_now_plus(60),
        },
        returning=("fence",),
    )
    assert claimed is not None, f"the floor's claim of {run_id} #{seq} was fenced out"
    sql.move_run_and_step(
        run_id=run_id,
        seq=seq,
        active=(RunStatus.RUNNING,),
        run_changes=advance,
        step_where=sql.StepWhere("{c}.status = 'IN_PROGRESS' AND {c}.fence = %s", (claimed[0],)),
        step_changes={
            **finished,
            "fence": claimed[0] + 1,
            "lease_expires_at": None,
            "lease_owner": "",
        },
        synchronous=last,
    )
