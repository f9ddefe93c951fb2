"""Deleting runs with their checkpoints and events: retention (docs/protocol.md, "Retention") and
clean-ups.

Set-based SQL, children first, at most `MAX_BATCH` runs per transaction: Django's
`on_delete=CASCADE` is emulated in Python (it fetches every row it deletes), and one big
transaction would hold its locks and its WAL burst until the end. The child tables are found
from the model's relations, so an engine table added later is deleted with its runs too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from django.db import connection, transaction
from django.db.models import Model

from agentflow._base.states import TERMINAL_RUN_STATUSES
from agentflow._store import sql
from agentflow.models import WorkflowRun

#: Runs per transaction (docs/protocol.md, "Retention"): about 12,000 rows with their checkpoints
#: and events, a fraction of a second of locks and WAL, however large the backlog.
MAX_BATCH = 1000
RUNS = WorkflowRun._meta.db_table


@dataclass(frozen=True, kw_only=True)
class Deleted:
    """What a delete removed (or, for a dry run, would remove)."""

    runs: int = 0
    #: Child rows by table name (checkpoints, events, ...).
    children: dict[str, int] = field(default_factory=dict)
    #: Runs deleted by each transaction, in order; empty for a dry run.
    batches: list[int] = field(default_factory=list)
    dry_run: bool = False

    @property
    def rows(self) -> int:
        return self.runs + sum(self.children.values())

    def describe(self) -> str:
        """'1,200 runs, 13,000 step checkpoints and 1,500 run events in 2 transactions'."""
        names = _child_names()
        parts = [f"{self.runs:,} workflow runs"] + [
            f"{count:,} {names.get(table, table)}"
            for table, count in self.children.items()
            if count
        ]
        listed = ", ".join(parts[:-1]) + f" and {parts[-1]}" if len(parts) > 1 else parts[0]
        if self.dry_run:
            return listed
        transactions = len(self.batches)
        return f"{listed} in {transactions:,} transaction{'s' if transactions != 1 else ''}"


def runs_purge(
    *,
    older_than: timedelta,
    dry_run: bool = False,
    max_batches: int | None = None,
    batch_size: int = MAX_BATCH,
) -> Deleted:
    """Delete finished runs (COMPLETED, FAILED, CANCELLED) created and last changed more than
    `older_than` ago, with their checkpoints and events; never active or parked runs.

    Candidates come from the `run_created` index (created_at), oldest first; the status and
    `updated_at` (deliberately not indexed: every step writes it, and an index on it would
    end HOT updates) are checked on those rows only. Each batch locks its runs (SKIP LOCKED:
    an operator acting on one keeps it) and deletes them in one transaction. `max_batches`
    bounds one call, so a beat tick stays short however large the backlog; the next goes on.
    """
    _check_batch_size(batch_size)
    cutoff = sql.db_now() - older_than  # the database's clock: a host's may be off
    finished = " AND ".join(
        [
            "created_at < %s",
            f"status IN ({_placeholders(TERMINAL_RUN_STATUSES)})",
            "updated_at < %s",
        ]
    )
    params = [_adapt(cutoff), *TERMINAL_RUN_STATUSES, _adapt(cutoff)]
    if dry_run:
        return _count(f"SELECT id FROM {RUNS} WHERE {finished}", params)
    batches: list[int] = []
    children: dict[str, int] = {}
    after: tuple[Any, str] | None = None
    while max_batches is None or len(batches) < max_batches:
        with transaction.atomic():
            keyset, keyset_params = "", []
            if after is not None:
                # Past the rows earlier batches left behind (locked by someone else), served
                # by the index: created_at >= the last one seen, then ties broken by id.
                keyset = " AND created_at >= %s AND (created_at > %s OR id > %s)"
                keyset_params = [after[0], after[0], after[1]]
            rows = _fetch(
                f"SELECT id, created_at FROM {RUNS} WHERE {finished}{keyset} "
                f"ORDER BY created_at, id LIMIT %s{_lock_clause()}",
                [*params, *keyset_params, batch_size],
            )
            if not rows:
                break
            after = (rows[-1][1], rows[-1][0])
            batches.append(_delete_batch([row[0] for row in rows], children))
        if len(rows) < batch_size:
            break
    return Deleted(runs=sum(batches), children=children, batches=batches)


def runs_delete(
    *, ids: Iterable[str] | None = None, workflows: Sequence[str] | None = None
) -> Deleted:
    """Delete the given runs, or every run of the given workflows, whatever their status,
    with their checkpoints and events, in the same batches as retention.

    For clean-ups of benchmark and chaos runs: stop the workers that could run them first.
    """
    if (ids is None) == (workflows is None):
        raise ValueError("give either ids or workflows")
    if workflows is not None:
        names = list(workflows)
        if not names:
            return Deleted()
        ids = [
            row[0]
            for row in _fetch(
                f"SELECT id FROM {RUNS} WHERE workflow IN ({_placeholders(names)})", names
            )
        ]
    assert ids is not None
    batches: list[int] = []
    children: dict[str, int] = {}
    for chunk in _chunks(list(dict.fromkeys(ids)), MAX_BATCH):
        with transaction.atomic():
            locked = [
                row[0]
                for row in _fetch(
                    f"SELECT id FROM {RUNS} WHERE id IN ({_placeholders(chunk)}){_lock_clause()}",
                    chunk,
                )
            ]
            if locked:
                batches.append(_delete_batch(locked, children))
    return Deleted(runs=sum(batches), children=children, batches=batches)


def _delete_batch(run_ids: list[str], children: dict[str, int]) -> int:
    """Children first, then the runs; adds the child counts to `children`. Inside the
    caller's transaction, with the runs already locked."""
    marks = _placeholders(run_ids)
    with connection.cursor() as cursor:
        for table, column in _child_tables():
            cursor.execute(f"DELETE FROM {table} WHERE {column} IN ({marks})", run_ids)
            children[table] = children.get(table, 0) + cursor.rowcount
        cursor.execute(f"DELETE FROM {RUNS} WHERE id IN ({marks})", run_ids)
        return int(cursor.rowcount)


def _count(selection: str, params: list[Any]) -> Deleted:
    """A dry run: what `selection` (a query of run ids) would delete, counted, not deleted."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM ({selection}) AS chosen", params)
        runs = int(cursor.fetchone()[0])
        children = {}
        for table, column in _child_tables():
            cursor.execute(f"SELECT count(*) FROM {table} WHERE {column} IN ({selection})", params)
            children[table] = int(cursor.fetchone()[0])
    return Deleted(runs=runs, children=children, dry_run=True)


@cache
def _child_tables() -> list[tuple[str, str]]:
    """(table, run id column) of every engine table that references a run.

    Only the engine's own tables: a domain app that pointed a foreign key at runs would make
    the delete fail loudly rather than have the engine delete its rows.
    """
    return sorted(
        (model._meta.db_table, column)
        for model, column in _referencing()
        if model._meta.app_label == WorkflowRun._meta.app_label
    )


@cache
def _child_names() -> dict[str, str]:
    return {
        model._meta.db_table: str(model._meta.verbose_name_plural) for model, _ in _referencing()
    }


def _referencing() -> list[tuple[type[Model], str]]:
    """Models with a foreign key to runs, and that key's column."""
    found = []
    for relation in WorkflowRun._meta.related_objects:
        model = relation.related_model
        assert not isinstance(model, str)  # resolved once the app registry is ready
        found.append((model, relation.field.column))
    return found


def _fetch(query: str, params: list[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return list(cursor.fetchall())


def _lock_clause() -> str:
    # SQLite has no row locks: its write transaction (IMMEDIATE) already excludes every writer.
    locks = connection.features.has_select_for_update_skip_locked
    return " FOR UPDATE SKIP LOCKED" if locks else ""


def _adapt(moment: datetime) -> Any:
    return connection.ops.adapt_datetimefield_value(moment)


def _placeholders(values: Sequence[Any]) -> str:
    return ", ".join("%s" for _ in values)


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _check_batch_size(batch_size: int) -> None:
    if not 1 <= batch_size <= MAX_BATCH:
        raise ValueError(f"batch_size must be 1 to {MAX_BATCH}, got {batch_size}")
