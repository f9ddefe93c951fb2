"""The shop's background work as Django's own `@task` functions, run by agentflow's tasks
backend (copied to orders/tasks.py once TASKS names it)."""

from __future__ import annotations

import time
from typing import Any

from orders.models import PartnerCall, Release, Shipment

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task


@task(takes_context=True)
def ship_order(context: Any, order: int, hold: bool = False) -> dict[str, Any]:
    """The partner: each call counted, the shipment made once per idempotency key."""
    key = context.idempotency_key
    PartnerCall.objects.create(key=key)
    if hold:  # the test reads RUNNING from another process, then lets it go
        deadline = time.monotonic() + 120
        while not Release.objects.filter(result_id=context.task_result.id).exists():
            if time.monotonic() > deadline:
                raise RuntimeError("never released")
            time.sleep(0.05)
    shipment, _ = Shipment.objects.get_or_create(key=key, defaults={"order": order})
    return {"shipment": shipment.pk, "key": key}
