"""The run page's timeline after a real crash: a pool child SIGKILLed mid-step.

The step's first attempt dies with its process; the redelivered message finds the owner gone
and takes the step over. The picture must show both attempts and the crash gap between the
first one's claim and the takeover, drawn from what the engine recorded.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.test import Client

from agentflow import durable
from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus
from agentflow.models import WorkflowRun
from agentflow.testing.waiting import wait_for
from tests.support import partner, workflows
from tests.support.processes import Workers
from tests.support.timelines import box, elements, title

pytestmark = pytest.mark.django_db(transaction=True)

HOLD_SEQ = "2"


def first_attempt_pid(run_id: str) -> int:
    def started() -> dict[str, Any] | None:
        return next((e for e in partner.executions(run_id) if e["step"] == "hold"), None)

    return int(wait_for(started, timeout=30, interval=0.02, what="hold to start")["pid"])


def finished(run_id: str) -> WorkflowRun:
    def done() -> WorkflowRun | None:
        run = WorkflowRun.objects.get(pk=run_id)
        return run if run.status not in ACTIVE_RUN_STATUSES else None

    return wait_for(done, timeout=30, interval=0.05, what=f"{run_id} to finish")


def test_timeline__worker_killed_mid_step__two_attempts_and_the_gap_between(
    workers: Workers, admin_client: Client
) -> None:
    worker = workers.start()
    run_id = durable.start(workflows.held.name)
    child = first_attempt_pid(run_id)
    assert child in worker.children()

    os.kill(child, signal.SIGKILL)
    partner.release(run_id)
    assert finished(run_id).status == RunStatus.COMPLETED

    page = admin_client.get(f"/admin/agentflow/workflowrun/{quote(run_id)}/change/")
    svg = page.content.decode().split('<svg class="af-timeline-svg"', 1)[1]
    svg = '<svg class="af-timeline-svg"' + svg.split("</svg>", 1)[0] + "</svg>"
    hold = [a for a in elements(svg, "af-tl-attempt") if a.get("data-seq") == HOLD_SEQ]
    assert [a.get("data-outcome") for a in hold] == ["lost", "completed"]
    [gap] = [g for g in elements(svg, "af-tl-gap") if g.get("data-seq") == HOLD_SEQ]
    first, second = box(hold[0]), box(hold[1])
    # claim of attempt 1 ... crash gap ... attempt 2, in that order on the time axis
    assert first[0] <= box(gap)[0] + 0.2
    assert box(gap)[1] <= second[0] + 0.2
    assert "crash gap" in title(gap) and "taken over at" in title(gap)
    assert "attempt 1 of 2" in title(hold[0]) and "attempt 2 of 2" in title(hold[1])
