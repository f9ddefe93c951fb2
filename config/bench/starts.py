"""Runs started per second (issue 40, docs/figures/bench.md "Starting runs"): one
`durable.start` per transaction, as a form post starts a run, against `durable.start_many` of
the same runs in one transaction. Both in this process, against the configured Postgres and
broker, each first message published (after its commit) as in production; nothing consumes
them. The runs are deleted and the bench queue emptied afterwards."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from celery import current_app
from django.db import transaction

from agentflow import durable
from agentflow._core import dispatch
from config.bench import workload

#: Runs per batch `start_many` is given: what a cancelled flight's manifest brings at most.
BATCH = 1000


def starts(runs: int, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Runs/s one by one and in bulk (batches of BATCH), with business keys as a form's."""
    tag = f"bench-start-{time.time_ns()}"
    progress(f"{runs:,} runs started one by one")
    began = time.perf_counter()
    one_by_one = []
    for i in range(runs):
        with transaction.atomic():
            one_by_one.append(
                durable.start(workload.MIXED, input={"i": i}, business_key=f"{tag}-1-{i}")
            )
    single = time.perf_counter() - began
    progress(f"{runs:,} runs started with start_many")
    began = time.perf_counter()
    bulk: list[str] = []
    for first in range(0, runs, BATCH):
        with transaction.atomic():
            bulk += durable.start_many(
                (workload.MIXED, {"i": i}, f"{tag}-n-{i}")
                for i in range(first, min(first + BATCH, runs))
            )
    many = time.perf_counter() - began
    durable.delete_runs([*one_by_one, *bulk])
    _empty_queue()
    return {
        "runs": runs,
        "batch": BATCH,
        "one_by_one_runs_per_s": round(runs / single, 1),
        "one_by_one_ms_per_run": round(single / runs * 1000, 3),
        "bulk_runs_per_s": round(runs / many, 1),
        "bulk_ms_per_run": round(many / runs * 1000, 3),
        "ratio": round(single / many, 1),
    }


def _empty_queue() -> None:
    """The first messages of the deleted runs (no worker of the bench consumes meanwhile)."""
    app = current_app._get_current_object()
    with app.connection_for_write() as connection:
        connection.default_channel.queue_purge(dispatch.shared_queue(app))
