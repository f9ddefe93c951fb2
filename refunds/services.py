"""Write paths behind the customer pages: create a refund request once, and rate-limit them."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.db.models.functions import Lower
from django.utils import timezone

from agentflow import durable
from refunds import engines
from refunds.models import RefundRequest, new_public_id

#: The window REFUNDS_SUBMIT_LIMIT counts in (SPEC §6: "per hour").
LIMIT_WINDOW = timedelta(hours=1)
#: The window REFUNDS_BOOKING_LIMIT counts in (SPEC §6: "per day").
BOOKING_LIMIT_WINDOW = timedelta(days=1)
#: The same words from the same customer within this window are the same request: a browser
#: without a back/forward cache re-fetches the form (a fresh token) when they go back.
RESUBMIT_WINDOW = timedelta(minutes=15)


def refund_request_create(
    *,
    email: str,
    booking_reference: str,
    last_name: str,
    message: str,
    submission_token: str,
    client_ip: str | None,
) -> RefundRequest:
    """Create the request and start its workflow in one transaction, once per token.

    A token seen before returns the request it created, whatever the other fields say now:
    a double click, a back button or a replayed POST never makes a second refund. Two
    concurrent submissions of one token race on the unique constraint; the loser's rows
    (its run included) roll back and it returns the winner's request.
    """
    existing = refund_request_by_token(submission_token) or _same_request_recently(
        email=email, booking_reference=booking_reference, last_name=last_name, message=message
    )
    if existing is not None:
        return existing
    public_id = new_public_id()
    try:
        with transaction.atomic():
            # The run's first step is published only when this transaction commits, so the
            # worker always finds the request it is told about.
            workflow_id = durable.start(
                engines.workflow_name(), input={"refund_id": public_id}, business_key=public_id
            )
            return RefundRequest.objects.create(
                public_id=public_id,
                email=email,
                booking_reference=booking_reference,
                last_name=last_name,
                message=message,
                submission_token=submission_token,
                client_ip=client_ip,
                workflow_id=workflow_id,
            )
    except IntegrityError:
        existing = refund_request_by_token(submission_token)
        if existing is None:
            raise
        return existing


def refund_request_by_token(submission_token: str) -> RefundRequest | None:
    return RefundRequest.objects.filter(submission_token=submission_token).first()


def _same_request_recently(
    *, email: str, booking_reference: str, last_name: str, message: str
) -> RefundRequest | None:
    """The same words within RESUBMIT_WINDOW. The name counts too: a corrected last name
    after a mismatch is a new request, not the failed one again."""
    return (
        RefundRequest.objects.annotate(email_ci=Lower("email"))
        .filter(
            email_ci=email.lower(),
            booking_reference=booking_reference,
            last_name=last_name,
            message=message,
            created_at__gt=timezone.now() - RESUBMIT_WINDOW,
        )
        .order_by("created_at")
        .first()
    )


def submissions_allowed(*, email: str, client_ip: str | None) -> tuple[bool, int]:
    """Whether another submission fits REFUNDS_SUBMIT_LIMIT per hour, per e-mail and per
    client address (its limit key, see agentflow.proxies); if not, the seconds until one does
    (for Retry-After). Checked before a request or its run is created.

    Counted from the requests table rather than a cache, so the limits hold across web
    processes and restarts with nothing else to run. Two simultaneous submissions may both
    squeeze under a limit; it is a brake on abuse, not an invariant.
    """
    limit = settings.REFUNDS_SUBMIT_LIMIT
    if limit <= 0:
        return True, 0
    now = timezone.now()
    recent = RefundRequest.objects.filter(created_at__gt=now - LIMIT_WINDOW)
    by_email = recent.annotate(email_ci=Lower("email")).filter(email_ci=email.lower())
    retry_after = _seconds_until_a_slot(by_email, limit, now, LIMIT_WINDOW)
    if client_ip:
        by_address = recent.filter(client_ip=client_ip)
        retry_after = max(retry_after, _seconds_until_a_slot(by_address, limit, now, LIMIT_WINDOW))
    return retry_after == 0, retry_after


def booking_requests_allowed(booking_reference: str) -> tuple[bool, int]:
    """Whether another request for this booking fits REFUNDS_BOOKING_LIMIT per day, whoever
    sends it, and if not the seconds until one does. It bounds guessing a booking's name and
    e-mail from many addresses; a failed guess counts like any request."""
    limit = settings.REFUNDS_BOOKING_LIMIT
    if limit <= 0:
        return True, 0
    now = timezone.now()
    by_booking = RefundRequest.objects.filter(
        booking_reference=booking_reference, created_at__gt=now - BOOKING_LIMIT_WINDOW
    )
    retry_after = _seconds_until_a_slot(by_booking, limit, now, BOOKING_LIMIT_WINDOW)
    return retry_after == 0, retry_after


def _seconds_until_a_slot(
    requests: QuerySet[RefundRequest], limit: int, now: datetime, window: timedelta
) -> int:
    """0 if fewer than `limit` fall in the window; else when the oldest of the newest `limit`
    leaves it (at least 1 second)."""
    created = requests.order_by("-created_at").values_list("created_at", flat=True)
    newest = list(created[:limit])
    if len(newest) < limit:
        return 0
    return max(1, math.ceil((newest[-1] + window - now).total_seconds()))
