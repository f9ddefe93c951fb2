"""A child run that ends rings its parent's doorbell (docs/workflows.md, "Runs that start
runs"): after the child's own commit, the parent's step is published, and its wait counts its
children again. A doorbell lost in a crash between the two costs latency, never the parent:
the wait rechecks on its own (`agentflow._children`). Apart from `store.children` so the
paths that end a run import nothing that imports them.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError, transaction

from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus
from agentflow._core import dispatch, registry
from agentflow._store import sql

logger = logging.getLogger("agentflow.store.parents")  # the name hosts' LOGGING knows


def run_ended(run_id: str, *, child: bool | None = None) -> None:
    """The run ended in the current transaction: once that commits, if it is a child whose
    parent is still active, publish the parent's step so its wait counts again. `child`: what
    the caller already read of the run (False: no parent, nothing to look up; None: unknown)."""
    if child is not False:
        transaction.on_commit(lambda: _ring_parent(run_id))


def _ring_parent(run_id: str) -> None:
    try:
        row = sql.fetch_one(
            f"""SELECT p.id, p.current_seq, p.status, p.workflow, p.version, p.current_step
            FROM {sql.RUNS} c JOIN {sql.RUNS} p ON p.id = c.parent_id
            WHERE c.id = %s AND p.status IN ({sql.placeholders(ACTIVE_RUN_STATUSES)})""",
            [run_id, *ACTIVE_RUN_STATUSES],
        )
    except DatabaseError:
        # The child's end is committed; its parent's wait counts again at its recheck.
        logger.warning("could not ring the parent of %s; its wait rechecks", run_id)
        return
    if row is not None and (row[2] == RunStatus.WAITING or _at_its_wait(row[3], row[4], row[5])):
        dispatch.send_step(row[0], int(row[1]))


def _at_its_wait(workflow: str, version: int, step_name: str) -> bool:
    """Whether the parent, running, is at a step that waits for children (it may be counting
    them right now, before this child's end): ringing a parent at any other step would only
    run that step's message twice."""
    definition = registry.lookup(workflow, int(version))
    step = definition.steps.get(step_name) if definition is not None else None
    return step is not None and getattr(step.waits_for, "counts_children", False)
