"""The shop's workflow: found by agentflow in every installed app's workflows.py."""

from __future__ import annotations

from typing import Any

from orders.models import PartnerCall, Shipment

from agentflow import durable

fulfil = durable.Workflow("fulfil_order", version=1)


@fulfil.step("reserve", kind="read")
def reserve(ctx: durable.StepContext) -> dict[str, Any]:
    return {"order": ctx.input["order"]}


@fulfil.step("ship", kind="effect")
def ship(ctx: durable.StepContext) -> dict[str, Any]:
    """The partner: each call is counted; the shipment happens once per idempotency key."""
    PartnerCall.objects.create(key=ctx.idempotency_key)
    shipment, created = Shipment.objects.get_or_create(
        key=ctx.idempotency_key, defaults={"order": ctx.input["order"]}
    )
    return {"shipment": shipment.pk, "replayed": not created}


@fulfil.step("confirm", kind="read")
def confirm(ctx: durable.StepContext) -> dict[str, Any]:
    return {"shipment": ctx.output_of("ship")["shipment"]}
