"""The shop's own tests of its workflow, with agentflow.testing (its pytest plugin loads by
itself: nothing in conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest
from orders.models import PartnerCall, Shipment

from agentflow import durable, testing


def shipped(key: str) -> int:
    return Shipment.objects.filter(key=key).count()


@pytest.mark.django_db
def test_fulfil__crash_after_shipping__ships_once() -> None:
    run_id = durable.start("fulfil_order", input={"order": 7}, business_key="order-7")
    with testing.crash_at("ship:after_effect"):
        run = testing.run_to_end(run_id)
    assert run.status == "COMPLETED"
    testing.assert_effects_once(run_id, partner=lambda k: Shipment.objects.filter(key=k).count())


def test_fulfil__real_worker_killed_after_shipping__ships_once(agentflow_worker: Any) -> None:
    worker = agentflow_worker(env=testing.crash_env("ship:after_effect"))
    run_id = durable.start("fulfil_order", input={"order": 8})

    run = testing.wait_for_run(run_id, timeout=60, worker=worker)

    assert run.status == "COMPLETED", run.error
    [key] = testing.assert_effects_once(run_id, partner=shipped)
    assert PartnerCall.objects.filter(key=key).count() == 2  # asked again after the kill
