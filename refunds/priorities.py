"""Which refund goes first, and which never go together.

See docs/refunds.md, "A busy hour: customers first, one run per booking".

A customer who writes in is not queued behind a cancelled flight's batch: a refund from the form
runs at `CUSTOMER` priority, one started in bulk for a flight at `BATCH`. And one booking is
changed by one run at a time: refund runs carry the booking reference as their concurrency key
(the engine keeps only its HMAC), so a second request for the same booking, whatever its words,
starts once the first has ended, and sees what the first did to the seat.
"""

from __future__ import annotations

from typing import Any

from agentflow import durable
from refunds import wording
from refunds.models import RefundRequest

#: A refund a customer asked for from the form.
CUSTOMER = 7
#: A refund the refund service starts itself, many at once (a cancelled flight's passengers).
BATCH = 2
#: Runs of one booking at once.
PER_BOOKING = 1


def booking_of(input: Any) -> str:
    """The run's booking: named in its input (`booking_reference`, a run started in bulk), or
    its request's. Upper-cased, as the airline reads references."""
    reference = input.get("booking_reference") if isinstance(input, dict) else None
    if not reference:
        reference = (
            RefundRequest.objects.filter(public_id=input["refund_id"])
            .values_list("booking_reference", flat=True)
            .get()
        )
    return str(reference).strip().upper()


def already_changed(request: RefundRequest, *, seat_held: bool) -> str:
    """What the customer is told when an earlier request of theirs already changed this
    booking (its run completed, and the airline says the original seat is gone), else "".
    Runs of one booking go one at a time, so this request's run starts only after that one
    ended, and reads the booking as it left it."""
    if seat_held:
        return ""
    earlier = (
        RefundRequest.objects.filter(
            booking_reference__iexact=request.booking_reference.strip(),
            created_at__lte=request.created_at,
            workflow_id__isnull=False,
        )
        .exclude(pk=request.pk)
        .order_by("-created_at")
    )
    for other in earlier[:5]:
        run = durable.snapshot(str(other.workflow_id))
        if run is None or run.status != durable.RunStatus.COMPLETED:
            continue
        issued = next((s.output for s in run.steps if s.name == "issue_boarding_pass"), None)
        if isinstance(issued, dict):
            said = wording.ALREADY_CHANGED_TO.say(
                flight=str(issued.get("flight", "")),
                date=wording.date_in_words(str(issued.get("date", ""))),
                seat=str(issued.get("seat", "")),
            )
            if said:
                return said
        return wording.ALREADY_CHANGED
    return ""
