"""Step messages carry their run's priority on whatever path publishes them (docs/workflows.md,
"Priorities"): the start, the step's own successor, and a step that waited for its turn at a
partner, published again by the sweeper. On Redis each priority has its list (`celery` is 9,
`celery:<9 - p>` the others), which is what this reads."""

from __future__ import annotations

import json
from base64 import b64decode
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from agentflow import durable
from agentflow._base.states import RunStatus
from agentflow._recovery import sweeper
from agentflow.models import PartnerState, PartnerWaiter, WorkflowRun
from tests.support import workflows
from tests.support.processes import RedisServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]


def queued(broker: RedisServer) -> dict[str, list[list[Any]]]:
    """Step messages' args by the Redis list they wait in."""
    client = broker.client()
    found: dict[str, list[list[Any]]] = {}
    for key in sorted(k.decode() for k in client.keys("celery*")):
        bodies = [
            json.loads(b64decode(json.loads(raw)["body"])) for raw in client.lrange(key, 0, -1)
        ]
        found[key] = [args for args, _, _ in bodies]
    return found


def test_start__the_run_s_priority_picks_its_list__none_goes_to_the_first(
    engine: RedisServer,
) -> None:
    urgent = durable.start(workflows.one_read.name, priority=9)
    customer = durable.start(workflows.one_read.name, priority=7)
    batch = durable.start(workflows.one_read.name, priority=2)
    plain = durable.start(workflows.chain.name)
    assert queued(engine) == {
        "celery": [[plain, 1], [urgent, 1]],  # newest first (LPUSH); kombu pops from the right
        "celery:2": [[customer, 1]],
        "celery:7": [[batch, 1]],
    }


@override_settings(AGENTFLOW_PARTNER_LIMITS={"acme": {"rate": "1/m"}})
def test_partner_wait__the_step_published_again_keeps_its_priority(
    engine: RedisServer, drive: Callable[[str], WorkflowRun]
) -> None:
    run_id = durable.start(workflows.limited.name, priority=7)
    run = drive(run_id)  # look_up takes acme's turn; charge's waits a minute for the next
    assert run.status == RunStatus.WAITING and PartnerWaiter.objects.filter(run_id=run_id)
    engine.client().flushdb()

    PartnerWaiter.objects.update(go_at=0.0)  # its turn comes, and the run is due
    PartnerState.objects.update(next_turn_at=0.0, spent_until=0.0, blocked_until=0.0)
    WorkflowRun.objects.filter(pk=run_id).update(wake_at=timezone.now() - timedelta(seconds=1))
    assert run_id in sweeper.sweep().requeued

    assert queued(engine) == {"celery:2": [[run_id, run.current_seq]]}
