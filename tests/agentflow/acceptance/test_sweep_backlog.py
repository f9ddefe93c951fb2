"""A burst queued longer than a lease, on real workers: it completes, and the sweeper rings each
waiting message a logarithmic number of times, not once a lease (docs/how-it-works.md, "Postgres
is the truth, the broker is a doorbell").

`BACKLOG_RUNS` (200) sets the burst; `BACKLOG_SWEEP_BACKOFF_MAX_SECONDS` the worker's cap, so
`=2` (the lease) measures the fixed one-lease gap the sweeper had before its back-off (the
bound is then not asserted). The test prints its figures: docs/how-it-works.md quotes them.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import pytest
from django.utils import timezone

from agentflow import durable
from agentflow._base.states import RunStatus
from agentflow.models import RunEvent, WorkflowRun
from agentflow.testing.waiting import wait_for
from tests.support import partner, workflows
from tests.support.processes import Workers

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = int(os.environ.get("BACKLOG_RUNS", "200"))
LEASE_SECONDS = 2.0
CAP = os.environ.get("BACKLOG_SWEEP_BACKOFF_MAX_SECONDS", "300")
STEPS = len(workflows.chain.steps)


def test_backlog_longer_than_a_lease__completes_with_logarithmic_re_publishes(
    workers: Workers, settings: Any
) -> None:
    settings.AGENTFLOW_LEASE_SECONDS = LEASE_SECONDS  # the runs' first wake-up: a lease on
    run_ids = [durable.start(workflows.chain.name) for _ in range(RUNS)]
    # Every first message has waited past its lease before a worker is there to take it.
    wait_for(
        lambda: not WorkflowRun.objects.filter(wake_at__gt=timezone.now()).exists(),
        timeout=30,
        what="every run past its wake-up time",
    )
    started = time.monotonic()
    worker = workers.start(
        concurrency=2,
        beat=True,  # its sweeper, every second
        AGENTFLOW_LEASE_SECONDS=str(int(LEASE_SECONDS)),
        AGENTFLOW_SWEEP_INTERVAL="1",
        AGENTFLOW_SWEEP_BACKOFF_MAX_SECONDS=CAP,
    )
    done = WorkflowRun.objects.filter(pk__in=run_ids, status=RunStatus.COMPLETED)
    wait_for(lambda: done.count() == RUNS, timeout=900, what=f"{RUNS} runs completed")
    elapsed = time.monotonic() - started
    assert worker.alive()

    rings = RunEvent.objects.filter(run_id__in=run_ids, kind=RunEvent.Kind.SWEEP_REQUEUE).count()
    # Each of the STEPS x RUNS messages waited at most `elapsed`, and its k-th ring comes 2^(k-1)
    # leases after it was published: at most 1 + log2(elapsed / lease) rings each. The fixed
    # gap rang every waiting message once a lease: up to elapsed / lease each.
    bound = STEPS * RUNS * (1 + math.log2(max(elapsed / LEASE_SECONDS, 1.0)))
    print(
        f"\n{RUNS} runs x {STEPS} steps, one worker of 2 processes, lease {LEASE_SECONDS:.0f} s, "
        f"back-off cap {CAP} s: completed in {elapsed:.1f} s, {rings} re-publishes "
        f"({rings / (STEPS * RUNS):.2f} per step; bound {bound:.0f})"
    )
    effects = partner.effects()
    assert len(effects) == RUNS and set(effects.values()) == {1}  # each charge once
    if float(CAP) > LEASE_SECONDS:
        assert rings <= bound
