"""Many runs in one statement, and the link between a parent run and the runs it started
(docs/workflows.md, "Runs that start runs" and "Many runs at once").

Runs are inserted a batch at a time with `ON CONFLICT DO NOTHING` on the business-key index,
so a batch sent again (a replay, a redelivered step, a caller's retry) creates none twice and
reads back the ids of the ones that exist. Their first steps are published after the commit,
with each run's priority, as `run_create` publishes one run's. Runs with a concurrency key go
through the same admission as one started alone (`store.concurrency`), decided for the whole
list at once: those over their key's cap are created WAITING and publish nothing. A child that
ends rings its parent (`store.parents`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from agentflow import _concurrency
from agentflow._base.states import ACTIVE_RUN_STATUSES, TERMINAL_RUN_STATUSES, RunStatus
from agentflow._conf import settings
from agentflow._core import builds, dispatch
from agentflow._core.registry import Workflow
from agentflow._privacy import scope
from agentflow._store import sql
from agentflow._store.builds import build_known
from agentflow._store.concurrency import (
    WAIT_WAKE_SECONDS,
    concurrency_admit_many,
    concurrency_held_many,
    concurrency_release_on_commit,
)
from agentflow._store.subject_keys import runs_subject_bind_many
from agentflow.models import new_run_id

#: Rows per INSERT: a statement's parameters stay far below Postgres' 65,535 (23 a row).
BATCH_ROWS = 1000


@dataclass(frozen=True, kw_only=True)
class NewRun:
    workflow: Workflow
    input: Any
    business_key: str | None
    #: 0-9, higher first (agentflow._priority); None: its messages go without one.
    priority: int | None = None
    #: The digest of its concurrency key (agentflow._concurrency), empty without one.
    concurrency_key: str = ""
    #: The subject key its workflow's personal fields are sealed under (docs/privacy.md);
    #: empty: nothing sealed (its workflow declares nothing personal, or no master key).
    subject_key: str = ""

    @property
    def limit(self) -> int | None:
        """The cap it is started under (None without a key)."""
        return (self.workflow.concurrency_limit or 1) if self.concurrency_key else None


def runs_create_many(
    runs: Sequence[NewRun], *, parent: tuple[str, int] | None = None
) -> tuple[list[str], list[str]]:
    """Create these runs (or find the ones with these business keys), in the caller's
    transaction, and publish the first step of each one created once it commits.

    Returns (the run ids in the order given, the ids created now). `parent`: (run id, seq)
    of the step that starts them. Two entries with one (workflow, business key) are one run.
    """
    build = builds.current()
    ids: list[str | None] = [None] * len(runs)
    created: list[str] = []
    grace = float(settings.AGENTFLOW_LEASE_SECONDS)
    with transaction.atomic():
        build_known(build)
        admitted = _admit(runs)
        for start in range(0, len(runs), BATCH_ROWS):
            batch = runs[start : start + BATCH_ROWS]
            made = _insert(
                batch,
                admitted[start : start + BATCH_ROWS],
                build=build,
                parent=parent,
                grace=grace,
            )
            created += made.values()
            _bind(batch, made)
            for offset, item in enumerate(batch):
                if item.business_key is None:
                    ids[start + offset] = made[offset]
            keyed = [(i + start, r) for i, r in enumerate(batch) if r.business_key is not None]
            if keyed:
                found = _ids_by_key([r for _, r in keyed])
                for index, item in keyed:
                    ids[index] = found[(item.workflow.name, item.business_key)]
        _held(runs, ids, admitted, set(created))
        _publish_on_commit(runs, ids, admitted, set(created), build)
    return [i for i in ids if i is not None], created


def _bind(batch: Sequence[NewRun], made: dict[int, str]) -> None:
    """Each run created sealed bound to its subject's key, in its own commit (as `start`)."""
    bindings = []
    for offset, run_id in made.items():
        item = batch[offset]
        if item.subject_key and item.workflow.personal is not None:
            bindings.append((run_id, item.subject_key, item.workflow.personal.names()))
    if bindings:
        runs_subject_bind_many(bindings)


def _stored_input(item: NewRun) -> Any:
    """The run's input as its column holds it: its personal fields sealed under its subject's
    key, and nothing sealed under the key of the run whose step starts it."""
    personal = item.workflow.personal
    if item.subject_key and personal is not None:
        with scope.sealing(item.subject_key, personal.fields):
            return sql.adapt("input", item.input)
    with scope.run_scope(None):
        return sql.adapt("input", item.input)


def _admit(runs: Sequence[NewRun]) -> list[bool]:
    """Which runs may start now: True for each without a concurrency key, the key's admission
    for the others (all of them decided together, in the order given)."""
    keyed = [(i, item) for i, item in enumerate(runs) if item.concurrency_key]
    admitted = [True] * len(runs)
    if keyed:
        decided = concurrency_admit_many([(r.concurrency_key, r.limit or 1) for _, r in keyed])
        for (index, _), admit in zip(keyed, decided, strict=True):
            admitted[index] = admit
    return admitted


def _insert(
    batch: Sequence[NewRun],
    admitted: Sequence[bool],
    *,
    build: str,
    parent: tuple[str, int] | None,
    grace: float,
) -> dict[int, str]:
    """One INSERT for the batch; returns {position in batch: id} of the rows it created. A run
    not admitted by its key is created WAITING, held by it, with a wake-up time the due-runs
    sweep never reaches (as `run_create` creates one)."""
    proposed = [new_run_id() for _ in batch]
    # Postgres' now() is the transaction's start, the same for every row: each row's own clock
    # keeps the order given, which is the order a key's waiters are admitted in.
    created_at = "clock_timestamp()" if sql.postgres() else sql.now()
    rows, params = [], []
    for run_id, item, admit in zip(proposed, batch, admitted, strict=True):
        rows.append(
            f"(%s, %s, %s, %s, %s, %s, 1, '', %s, '[]', false, 0, 0, {sql.now_plus()}, '', "
            f"%s, %s, %s, %s, {created_at}, {sql.now()}, %s, %s, %s, %s, %s)"
        )
        params += [
            run_id,
            item.workflow.name,
            item.workflow.version,
            _stored_input(item),
            RunStatus.PENDING if admit else RunStatus.WAITING,
            item.workflow.first_step(),
            item.business_key,
            grace if admit else WAIT_WAKE_SECONDS,
            build,
            build,
            item.workflow.versioning == "pinned",
            "" if admit else _concurrency.token(item.concurrency_key),
            parent[0] if parent else None,
            parent[1] if parent else None,
            item.priority,
            item.concurrency_key,
            item.limit,
        ]
    returned = sql.fetch_all(
        f"""INSERT INTO {sql.RUNS} (id, workflow, version, input, status, current_step,
            current_seq, error, business_key, compensations, cancel_requested, branch,
            fence_floor, wake_at, trace_parent, build, started_build, pinned, hold,
            created_at, updated_at, parent_id, parent_seq, priority, concurrency_key,
            concurrency_limit)
        VALUES {", ".join(rows)}
        ON CONFLICT (workflow, business_key) WHERE business_key IS NOT NULL DO NOTHING
        RETURNING id""",
        params,
    )
    made = {row[0] for row in returned}
    return {i: run_id for i, run_id in enumerate(proposed) if run_id in made}


def _held(
    runs: Sequence[NewRun], ids: Sequence[str | None], admitted: Sequence[bool], created: set[str]
) -> None:
    """The events of the runs created waiting for their key; and where a run that took a
    key's place was not created after all (its business key had a run), that key's waiters
    are looked at again once this commits, so none waits behind a place nobody holds."""
    held, unused = [], set()
    for item, run_id, admit in zip(runs, ids, admitted, strict=True):
        # A key given twice is one run, created by its first entry.
        made_here = run_id in created
        created.discard(run_id)
        if not item.concurrency_key or run_id is None:
            continue
        if made_here and not admit:
            why = _concurrency.reason(item.workflow.name, item.limit or 1)
            held.append((run_id, why, item.concurrency_key))
        elif admit and not made_here:
            unused.add(item.concurrency_key)
    concurrency_held_many(held)
    if unused:
        concurrency_release_on_commit(unused)


def _ids_by_key(keyed: Sequence[NewRun]) -> dict[tuple[str, str | None], str]:
    pairs = sorted({(r.workflow.name, r.business_key) for r in keyed})
    found: dict[tuple[str, str | None], str] = {}
    for workflow in sorted({name for name, _ in pairs}):
        keys = [key for name, key in pairs if name == workflow]
        rows = sql.fetch_all(
            f"SELECT business_key, id FROM {sql.RUNS} WHERE workflow = %s "
            f"AND business_key IN ({sql.placeholders(keys)})",
            [workflow, *keys],
        )
        found.update({(workflow, key): run_id for key, run_id in rows})
    return found


def _publish_on_commit(
    runs: Sequence[NewRun],
    ids: Sequence[str | None],
    admitted: Sequence[bool],
    created: set[str],
    build: str,
) -> None:
    """Each created and admitted run's first message, with its priority, after the commit, in
    the order given (a run waiting for its key is published when the key admits it)."""
    messages: list[tuple[str, int, dispatch.Fresh | None, str | None, int | None]] = []
    for item, run_id, admit in zip(runs, ids, admitted, strict=True):
        if run_id in created:
            created.discard(run_id)  # a key given twice is one run, published once
            if not admit:
                continue
            workflow = item.workflow
            hint = dispatch.fresh_hint(workflow, workflow.first_step())
            queue = builds.route(build, workflow.versioning == "pinned")
            messages.append((run_id, 1, hint, queue, item.priority))

    if messages:
        transaction.on_commit(lambda: dispatch.send_steps(messages))


# --- a parent and its children -------------------------------------------------------------
def children_ids(parent_id: str, seq: int) -> list[str]:
    """The runs the step at `seq` started, in the order it gave them."""
    rows = sql.fetch_all(
        f"SELECT id FROM {sql.RUNS} WHERE parent_id = %s AND parent_seq = %s "
        "ORDER BY created_at, business_key",
        [parent_id, seq],
    )
    return [row[0] for row in rows]


def children_counts(parent_id: str, seq: int | None = None) -> dict[str, int]:
    """How many of its children (those the step at `seq` started, or all) are in each status."""
    where = "parent_id = %s"
    params: list[Any] = [parent_id]
    if seq is not None:
        where += " AND parent_seq = %s"
        params.append(seq)
    rows = sql.fetch_all(
        f"SELECT status, COUNT(*) FROM {sql.RUNS} WHERE {where} GROUP BY status", params
    )
    return {str(status): int(n) for status, n in rows}


def children_started_at(parent_id: str, before_seq: int) -> int | None:
    """The latest position before `before_seq` whose step started children (None: none did)."""
    row = sql.fetch_one(
        f"SELECT MAX(parent_seq) FROM {sql.RUNS} WHERE parent_id = %s AND parent_seq < %s",
        [parent_id, before_seq],
    )
    return int(row[0]) if row is not None and row[0] is not None else None


@dataclass(frozen=True, kw_only=True)
class ChildEnd:
    """A child as its parent's wait reports it."""

    run_id: str
    workflow: str
    business_key: str | None
    status: str
    error: str
    output: Any


def children_ended(parent_id: str, seq: int, *, limit: int | None = None) -> list[ChildEnd]:
    """The children the step at `seq` started that have ended, earliest end first."""
    rows = sql.fetch_all(
        f"SELECT id, workflow, business_key, status, error, output FROM {sql.RUNS} "
        f"WHERE parent_id = %s AND parent_seq = %s "
        f"AND status IN ({sql.placeholders(TERMINAL_RUN_STATUSES)}) "
        f"ORDER BY updated_at, id{f' LIMIT {int(limit)}' if limit else ''}",
        [parent_id, seq, *TERMINAL_RUN_STATUSES],
    )
    return [
        ChildEnd(
            run_id=row[0],
            workflow=row[1],
            business_key=row[2],
            status=row[3],
            error=row[4],
            output=sql.read_json(row[5]),
        )
        for row in rows
    ]


def children_active(parent_id: str, seq: int | None = None) -> list[str]:
    """Its children that have not ended (those the step at `seq` started, or all), oldest
    first."""
    unfinished = (*ACTIVE_RUN_STATUSES, RunStatus.NEEDS_ATTENTION)
    where = f"parent_id = %s AND status IN ({sql.placeholders(unfinished)})"
    params: list[Any] = [parent_id, *unfinished]
    if seq is not None:
        where += " AND parent_seq = %s"
        params.append(seq)
    rows = sql.fetch_all(f"SELECT id FROM {sql.RUNS} WHERE {where} ORDER BY created_at, id", params)
    return [row[0] for row in rows]


def signal_keep(run_id: str, name: str, payload: Any, *, signal_id: str) -> bool:
    """Keep a signal for the run's own wait, once per `signal_id` (False: kept before). The
    wait that asks for it next takes it (`store.waits.signal_take`)."""
    return bool(
        sql.execute(
            f"""INSERT INTO {sql.SIGNALS} (run_id, signal_id, name, payload, received_at)
            VALUES (%s, %s, %s, %s, {sql.now()})
            ON CONFLICT (run_id, signal_id) DO NOTHING""",
            [run_id, signal_id, name, sql.adapt("payload", payload)],
        )
    )
