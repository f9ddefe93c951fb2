"""Write paths behind the customer pages: create a refund request once, and rate-limit them
without letting strangers lock a booking's owner out."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, OperationalError, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone
from psycopg.errors import DeadlockDetected

from agentflow import durable
from agentflow.models import StepCheckpoint
from refunds import engines, ownership, priorities, privacy
from refunds.gateways import AirlineGateway
from refunds.models import RefundRequest, new_public_id

#: The window REFUNDS_SUBMIT_LIMIT counts in
#: (docs/production.md, "Limits, and the client address behind a proxy": "per hour").
LIMIT_WINDOW = timedelta(hours=1)
#: The window REFUNDS_BOOKING_LIMIT and REFUNDS_OWNER_LIMIT count in
#: (docs/production.md, "Limits, and the client address behind a proxy": "per day").
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
    waiver_reason: str = "",
    waiver_details: str = "",
) -> RefundRequest:
    """Create the request and start its workflow in one transaction, once per token.

    A token seen before returns the request it created, whatever the other fields say now:
    a double click, a back button or a replayed POST never makes a second refund. Two
    concurrent submissions of one token race on the unique constraint; the loser's rows
    (its run included) roll back and it returns the winner's request.
    """
    existing = refund_request_by_token(submission_token) or _same_request_recently(
        email=email,
        booking_reference=booking_reference,
        last_name=last_name,
        message=message,
        waiver_reason=waiver_reason,
        waiver_details=waiver_details,
    )
    if existing is not None:
        return existing
    for attempt in range(1, DEADLOCK_ATTEMPTS + 1):
        try:
            return _create(
                email=email,
                booking_reference=booking_reference,
                last_name=last_name,
                message=message,
                waiver_reason=waiver_reason,
                waiver_details=waiver_details,
                submission_token=submission_token,
                client_ip=client_ip,
            )
        except IntegrityError:
            existing = refund_request_by_token(submission_token)
            if existing is None:
                raise
            return existing
        except OperationalError as exc:
            # Two sends of one form, each making its customer's keys (refunds.privacy) and
            # its request in one transaction, can each wait for the other: Postgres ends one
            # (seen with a double click in the browser test). That one finds the other's
            # request, or sends again.
            if not isinstance(exc.__cause__, DeadlockDetected) or attempt == DEADLOCK_ATTEMPTS:
                raise
            existing = refund_request_by_token(submission_token)
            if existing is not None:
                return existing
    raise AssertionError("unreachable")


#: Tries of one request's transaction when Postgres ends it to break a deadlock.
DEADLOCK_ATTEMPTS = 3


def _create(
    *,
    email: str,
    booking_reference: str,
    last_name: str,
    message: str,
    waiver_reason: str,
    waiver_details: str,
    submission_token: str,
    client_ip: str | None,
) -> RefundRequest:
    public_id = new_public_id()
    with transaction.atomic():
        # The run's first step is published only when this transaction commits, so the
        # worker always finds the request it is told about. The request comes first: the
        # run's concurrency key is its booking (refunds.priorities).
        request = RefundRequest.objects.create(
            public_id=public_id,
            email=email,
            email_digest=privacy.email_digest(email),
            booking_reference=booking_reference,
            last_name=last_name,
            message=message,
            waiver_reason=waiver_reason,
            waiver_details=waiver_details,
            submission_token=submission_token,
            client_ip=client_ip,
        )
        workflow_id = durable.start(
            engines.workflow_name(),
            # `customer` names whose run it is (refunds.privacy): sealed, as the request is.
            input={"refund_id": public_id, "customer": email.strip().lower()},
            business_key=public_id,
            priority=priorities.CUSTOMER,
        )
        RefundRequest.objects.filter(pk=request.pk).update(workflow_id=workflow_id)
        request.workflow_id = workflow_id
        return request


def refund_request_by_token(submission_token: str) -> RefundRequest | None:
    return RefundRequest.objects.filter(submission_token=submission_token).first()


def _same_request_recently(
    *,
    email: str,
    booking_reference: str,
    last_name: str,
    message: str,
    waiver_reason: str,
    waiver_details: str,
) -> RefundRequest | None:
    """The same words within RESUBMIT_WINDOW. The name counts too: a corrected last name
    after a mismatch is a new request, not the failed one again; and so does the waiver, so a
    request sent again with a waiver asked for is not taken for the one without. The words are
    sealed in their columns (refunds.privacy), so they are compared once read."""
    candidates = RefundRequest.objects.filter(
        email_digest=privacy.email_digest(email),
        booking_reference=booking_reference,
        waiver_reason=waiver_reason,
        created_at__gt=timezone.now() - RESUBMIT_WINDOW,
    ).order_by("created_at")
    wanted = (last_name, message, waiver_details)
    return next(
        (r for r in candidates if (r.last_name, r.message, r.waiver_details) == wanted), None
    )


@dataclass(frozen=True, kw_only=True)
class Refusal:
    """A request over a limit: the seconds until one fits (for Retry-After), and whether the
    booking's own limit is what refused it (the page says so)."""

    retry_after: int
    per_booking: bool


def refusal(
    *, email: str, booking_reference: str, last_name: str, client_ip: str | None
) -> Refusal | None:
    """Why another request does not fit the limits now, or None if it does. Checked before a
    request or its run is created.

    - Per client address (its limit key, see refunds.proxies): REFUNDS_SUBMIT_LIMIT an hour,
      every request counted.
    - Per e-mail (an hour, REFUNDS_SUBMIT_LIMIT) and per booking (a day, REFUNDS_BOOKING_LIMIT):
      only requests not found to come from the booking's owner (`_verified(..., False)`: their
      run failed the ownership check, or has not made it yet). They bound guessing a booking's
      name and e-mail, and since a reference is printed on every bag tag, a stranger's guesses
      must not lock its owner out: over either limit, the airline is asked at once whether
      these details are the owner's (refunds.ownership), and only a stranger is refused.
    - A verified owner's requests for the booking: REFUNDS_OWNER_LIMIT a day, their own.

    Counted from the requests table and their runs' recorded ownership checks rather than a
    cache, so the limits hold across web processes and restarts with nothing else to run. Two
    simultaneous submissions may both squeeze under a limit; it is a brake on abuse, not an
    invariant.
    """
    now = timezone.now()
    address_limit = settings.REFUNDS_SUBMIT_LIMIT
    if client_ip and address_limit > 0:
        by_address = RefundRequest.objects.filter(client_ip=client_ip)
        wait = _seconds_until_a_slot(by_address, address_limit, now, LIMIT_WINDOW)
        if wait:
            return Refusal(retry_after=wait, per_booking=False)
    by_booking = RefundRequest.objects.filter(booking_reference=booking_reference)
    owner_wait = _seconds_until_a_slot(
        _verified(by_booking, True), settings.REFUNDS_OWNER_LIMIT, now, BOOKING_LIMIT_WINDOW
    )
    if owner_wait:
        return Refusal(retry_after=owner_wait, per_booking=True)
    by_email = RefundRequest.objects.filter(email_digest=privacy.email_digest(email))
    email_wait = _seconds_until_a_slot(
        _verified(by_email, False), settings.REFUNDS_SUBMIT_LIMIT, now, LIMIT_WINDOW
    )
    booking_wait = _seconds_until_a_slot(
        _verified(by_booking, False), settings.REFUNDS_BOOKING_LIMIT, now, BOOKING_LIMIT_WINDOW
    )
    if not (email_wait or booking_wait):
        return None
    if _owner_now(booking_reference=booking_reference, last_name=last_name, email=email):
        return None
    return Refusal(retry_after=max(email_wait, booking_wait), per_booking=bool(booking_wait))


#: The steps that record a run's ownership check: the graph workflow's and the agent's.
OWNERSHIP_STEPS = ("fetch_booking", "verify_ownership")


def _verified(requests: QuerySet[RefundRequest], verified: bool) -> QuerySet[RefundRequest]:
    """The requests whose run passed its ownership check (True), or did not, yet or ever."""
    passed = StepCheckpoint.objects.filter(
        run_id=OuterRef("workflow_id"),
        name__in=OWNERSHIP_STEPS,
        status=durable.StepStatus.COMPLETED,
    )
    return requests.filter(Exists(passed) if verified else ~Exists(passed))


def _owner_now(*, booking_reference: str, last_name: str, email: str) -> bool:
    """Whether the airline's booking says these are its owner's details, asked from the web
    only when a stranger's limit is reached. An airline that cannot answer is a no."""
    try:
        booking = AirlineGateway.from_settings().booking(booking_reference)
    except durable.AgentflowError:  # unknown booking, unreachable, refused
        return False
    return ownership.is_owner(
        last_name=last_name,
        email=email,
        passenger_last_name=booking.passenger_last_name,
        contact_email=booking.contact_email,
    )


def _seconds_until_a_slot(
    requests: QuerySet[RefundRequest], limit: int, now: datetime, window: timedelta
) -> int:
    """0 if fewer than `limit` fall in the window (or `limit` is 0: off); else when the oldest
    of the newest `limit` leaves it (at least 1 second)."""
    if limit <= 0:
        return 0
    recent = requests.filter(created_at__gt=now - window)
    created = recent.order_by("-created_at").values_list("created_at", flat=True)
    newest = list(created[:limit])
    if len(newest) < limit:
        return 0
    return max(1, math.ceil((newest[-1] + window - now).total_seconds()))
