"""A cancelled flight (docs/refunds.md, "A cancelled flight"): the steps of `flight_cancelled`,
which reads the airline's manifest, starts one refund per passenger in one go, and tells the
operations team how they ended and what money moved.

Each passenger's refund is an ordinary refund request and run, as if they had sent the form:
moved to the flight and day the airline rebooked them on, owner's details from the manifest.
Its request's public id is derived from the parent run and the booking under the site's secret
key (unguessable, as a status page's key must be, and the same every time the step runs), and
its run is a child of this one (`durable.start_children`), so a replay or a crash of the step
creates neither twice.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

from django.conf import settings
from django.db import transaction

from agentflow import durable
from agentflow.models import StepCheckpoint
from refunds import engines, policy, priorities, privacy
from refunds.gateways import AirlineGateway, Mailer
from refunds.models import RefundRequest

#: What each passenger's request says, as a customer would write it.
WORDS = "My flight {old} was cancelled by the airline. Please move me to {flight} on {date}."


def read_manifest(ctx: durable.StepContext) -> dict[str, Any]:
    """The airline's manifest, each passenger's e-mail and last name sealed under their own
    key (refunds.privacy): this run is every passenger's, so it names no one subject, and what
    it keeps of each is erased with them."""
    manifest = AirlineGateway.from_settings().manifest(ctx.input["flight"], ctx.input["date"])
    passengers = manifest["passengers"]
    sealed = iter(
        durable.seal_personal(
            (p["email"].strip().lower(), p[field])
            for p in passengers
            for field in ("email", "last_name")
        )
    )
    manifest["passengers"] = [
        {"reference": p["reference"], "email": next(sealed), "last_name": next(sealed)}
        for p in passengers
    ]
    return manifest


def public_id(run_id: str, reference: str) -> str:
    """The passenger's request id: 128 bits of HMAC under the site's secret key."""
    mac = hmac.new(settings.SECRET_KEY.encode(), f"{run_id}:{reference}".encode(), hashlib.sha256)
    return "rf_" + base64.urlsafe_b64encode(mac.digest()[:16]).decode().rstrip("=")


def start_refunds(ctx: durable.StepContext) -> dict[str, Any]:
    """One refund request and run per passenger, together in one transaction: a request row
    each, then their runs as this run's children (one INSERT per thousand), then each request
    linked to its run."""
    manifest = ctx.output_of("read_manifest")
    moved = manifest["rebooked_to"]
    words = WORDS.format(old=manifest["flight"], flight=moved["flight"], date=moved["date"])
    passengers = manifest["passengers"]
    ids = {p["reference"]: public_id(ctx.run_id, p["reference"]) for p in passengers}
    with transaction.atomic(), durable.personal_keys(p["email"] for p in passengers):
        # Each request sealed under its passenger's key, the keys read or made together.
        RefundRequest.objects.bulk_create(
            [
                RefundRequest(
                    public_id=ids[p["reference"]],
                    email=p["email"],
                    email_digest=privacy.email_digest(p["email"]),
                    booking_reference=p["reference"],
                    last_name=p["last_name"],
                    message=words,
                    submission_token=f"flight:{ids[p['reference']]}",
                )
                for p in passengers
            ],
            ignore_conflicts=True,
        )
        # At batch priority, below a customer's form (refunds.priorities). The booking is in
        # each input, so its concurrency key is read without a query per passenger: a refund
        # the passenger sends for the same booking meanwhile waits for this one, or it for it.
        runs = durable.start_children(
            ctx,
            [
                (
                    engines.workflow_name(),
                    {
                        "refund_id": ids[p["reference"]],
                        "booking_reference": p["reference"],
                        # Whose run it is (refunds.privacy): sealed under their key, as the
                        # request is, and erased with it.
                        "customer": p["email"].strip().lower(),
                    },
                    p["reference"],
                )
                for p in passengers
            ],
            priority=priorities.BATCH,
        )
        requests = list(RefundRequest.objects.filter(public_id__in=ids.values()))
        by_public_id = {ids[p["reference"]]: run for p, run in zip(passengers, runs, strict=True)}
        for request in requests:
            request.workflow_id = by_public_id[request.public_id]
        RefundRequest.objects.bulk_update(requests, ["workflow_id"], batch_size=1000)
    return {"refunds": len(runs), "children": runs}


def started_refunds(ctx: durable.StepContext) -> dict[str, Any] | None:
    """Reconcile for `start_refunds`: the runs it started before its worker died (None: none,
    nothing was committed, it starts them now)."""
    runs = durable.started_children(ctx)
    return {"refunds": len(runs), "children": runs} if runs else None


def money_moved(run_ids: list[str]) -> dict[str, int]:
    """Cents taken (fees captured) and given back (refunds of taken fees) by these runs."""
    taken = given_back = 0
    steps = StepCheckpoint.objects.filter(
        run_id__in=run_ids, status=durable.StepStatus.COMPLETED, name__startswith="capture_fee"
    ) | StepCheckpoint.objects.filter(
        run_id__in=run_ids, status=durable.StepStatus.COMPLETED, name__startswith="refund_fee"
    )
    for name, output in steps.values_list("name", "output"):
        output = output or {}
        if name == "capture_fee" and output.get("captured"):
            taken += int(output.get("amount_cents", 0))
        elif name.startswith("refund_fee") and output.get("refunded"):
            given_back += int(output.get("amount_cents", 0))
    return {"taken_cents": taken, "refunded_cents": given_back}


def email_operations(ctx: durable.StepContext) -> dict[str, Any]:
    """Tell the operations team how the flight's refunds ended, by status, with the money."""
    manifest = ctx.output_of("read_manifest")
    report = ctx.output_of("wait_for_refunds")["payload"]
    runs = ctx.output_of("start_refunds")["children"]
    money = money_moved(runs)
    lines = [
        f"{manifest['flight']} on {manifest['date']} was cancelled by the airline; "
        f"{len(runs)} passengers were moved to {manifest['rebooked_to']['flight']} on "
        f"{manifest['rebooked_to']['date']}.",
        "",
        *(f"{status.lower()}: {n}" for status, n in sorted(report["counts"].items())),
        "",
        f"fees taken: {policy.format_amount(money['taken_cents'])}",
        f"fees refunded: {policy.format_amount(money['refunded_cents'])}",
    ]
    failed = [c for c in report["children"] if c["status"] != durable.RunStatus.COMPLETED]
    if failed:
        lines += ["", "Not completed (run, status, reason):"]
        lines += [f"- {c['run_id']} {c['status'].lower()}: {c['error']}" for c in failed]
    message_id = Mailer.from_settings().send(
        to=settings.REFUNDS_OPERATIONS_EMAIL,
        subject=f"{manifest['flight']} {manifest['date']} cancelled: {len(runs)} refunds",
        body="\n".join(lines),
        key=ctx.idempotency_key,
        workflow_id=ctx.run_id,
    )
    return {"message_id": message_id, "counts": report["counts"], **money}
