"""One client per partner (Stripe, airline, CRM, email), turning vendor errors into ours.

Every effect carries the step's idempotency key. Errors leave here as the engine's
`RetryableStepError` (try again later under the same key) or `PermanentStepError` (a readable
reason; retrying cannot help), so the workflow never has to know a vendor's exception classes.
"""

from __future__ import annotations

import random
import smtplib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import requests
import stripe
from django.conf import settings
from django.core.mail import EmailMessage, get_connection

from agentflow.durable import (
    PartnerRateLimited,
    PartnerUnavailable,
    PermanentStepError,
    RetryableStepError,
    RetryPolicy,
    partner_call,
)
from refunds.addresses import smtp_problem

#: Connect and read timeouts for partner HTTP calls: a hung partner must not hold a worker
#: (and its lease) for ever; the engine retries under the same key instead.
HTTP_TIMEOUT_SECONDS = (3.05, 10.0)
#: Partner calls back off under one key (equal jitter, doubling from the base). With the
#: defaults, 8 attempts span about two minutes: a short partner outage is ridden out; after a
#: long one the engine asks the partner what happened (reconcile) and fails the run only when
#: it did not happen, refunding any fee. Tests shrink the base to keep storms quick.
PARTNER_RETRY = RetryPolicy(
    max_attempts=settings.REFUNDS_PARTNER_MAX_ATTEMPTS,
    base_seconds=settings.REFUNDS_PARTNER_RETRY_BASE_SECONDS,
    max_seconds=60,
)
#: Undoing gives up much later (about a minute): if it fails, an operator must step in.
COMPENSATION_RETRY = RetryPolicy(max_attempts=8, base_seconds=0.5, max_seconds=60)
#: Stripe keeps idempotency keys for at least 24 hours; an older retry reconciles first.
STRIPE_KEY_WINDOW_SECONDS = 24 * 3600
#: An uncaptured card hold lapses after 7 days: capturing later fails and nothing is taken.
STRIPE_AUTHORIZATION_SECONDS = 7 * 24 * 3600
#: A capture retried later than this asks Stripe first: past the key window its key may be
#: forgotten, past the hold's life the hold is gone.
STRIPE_CAPTURE_WINDOW_SECONDS = min(STRIPE_KEY_WINDOW_SECONDS, STRIPE_AUTHORIZATION_SECONDS)
#: Stripe calls: one attempt's timeout and our retries of what the library would retry (same
#: key, so safe). They are made here, each request through `partner_call`, not in the library,
#: so the partner's limit counts every one of them (docs/partner-limits.md, "What happens").
STRIPE_TIMEOUT_SECONDS = 10
STRIPE_NETWORK_RETRIES = 2
#: The library's back-off between those retries: 0.5 s doubling, capped at 5 s, half jittered.
STRIPE_RETRY_BASE_SECONDS = 0.5
STRIPE_RETRY_MAX_SECONDS = 5.0


#: Objects per page of a Stripe list (its maximum): a day's payments in as few requests as can be.
LIST_PAGE_SIZE = 100


# --- values ---------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Payment:
    id: str
    amount_cents: int
    currency: str
    status: str


@dataclass(frozen=True, kw_only=True)
class Refund:
    id: str
    payment_intent_id: str
    amount_cents: int
    status: str


@dataclass(frozen=True, kw_only=True)
class Booking:
    reference: str
    passenger_name: str
    passenger_last_name: str
    #: The contact on file: the only address the refund ever writes to.
    contact_email: str
    flight: str
    date: str
    origin: str
    destination: str
    seat: str
    fare_class: str
    payment_method: str
    status: str
    #: The original seat is still the booking's: no cancellation of it stands.
    seat_held: bool = True


@dataclass(frozen=True, kw_only=True)
class SeatCancellation:
    cancellation_id: str
    reference: str
    seat: str
    status: str


@dataclass(frozen=True, kw_only=True)
class SeatReinstatement:
    reinstatement_id: str
    cancellation_id: str
    reference: str
    seat: str
    status: str


@dataclass(frozen=True, kw_only=True)
class BoardingPass:
    boarding_pass_id: str
    reference: str
    flight: str
    date: str
    seat: str
    barcode: str


@dataclass(frozen=True, kw_only=True)
class ScheduledFlight:
    """The airline's answer for one flight on one date: sold then, or why not (`past`,
    `beyond_horizon`, `not_operating`)."""

    flight: str
    date: str
    operates: bool
    reason: str
    last_bookable_date: str


# --- Stripe ---------------------------------------------------------------------------------
@lru_cache(maxsize=8)
def _stripe_client(api_key: str, api_base: str) -> stripe.StripeClient:
    return stripe.StripeClient(
        api_key,
        # Unset means real Stripe: only a test key and no base reaches api.stripe.com.
        base_addresses={"api": api_base} if api_base else None,
        max_network_retries=0,  # retried in `_stripe`, one counted request each
        http_client=stripe.RequestsClient(timeout=STRIPE_TIMEOUT_SECONDS),
    )


class PaymentGateway:
    """Stripe through the official library. The key and workflow id go into metadata too, so a
    payment can be found by its key after a crash (docs/protocol.md, "Unknown outcomes").

    The fee is held first (manual capture) and taken only once the change is made; a failure
    before that releases the hold, so nothing ever reaches the customer's statement.
    """

    def __init__(self, *, api_key: str, api_base: str = "") -> None:
        self._client = _stripe_client(api_key, api_base or "")

    @classmethod
    def from_settings(cls) -> PaymentGateway:
        return cls(api_key=settings.STRIPE_API_KEY, api_base=settings.STRIPE_API_BASE)

    def authorize(
        self,
        *,
        amount_cents: int,
        currency: str,
        payment_method: str,
        description: str,
        key: str,
        workflow_id: str,
        metadata: dict[str, str] | None = None,
    ) -> Payment:
        """Hold the amount on the card (`requires_capture`); `capture` takes it later."""
        params: Any = {
            "amount": amount_cents,
            "currency": currency,
            "payment_method": payment_method,
            "payment_method_types": ["card"],  # no redirect methods: confirm needs no return_url
            "capture_method": "manual",
            "confirm": True,
            "description": description,
            "metadata": {**(metadata or {}), "idempotency_key": key, "workflow_id": workflow_id},
        }
        intent = _stripe(
            "authorize",
            "payment",
            lambda: self._client.v1.payment_intents.create(
                params, options={"idempotency_key": key}
            ),
        )
        return _payment(intent)

    def capture(self, *, payment_intent_id: str, key: str) -> Payment:
        """Take the held amount. Already taken (an earlier attempt whose key Stripe has since
        forgotten) is the same success; a hold that lapsed or was released cannot be taken."""
        try:
            intent = _stripe(
                "capture",
                "capture",
                lambda: self._client.v1.payment_intents.capture(
                    payment_intent_id, options={"idempotency_key": key}
                ),
            )
        except PermanentStepError as refused:
            now = self.payment(payment_intent_id)
            if now.status == "succeeded":
                return now
            if now.status == "canceled":
                raise HoldLapsed from refused
            raise
        return _payment(intent)

    def cancel_authorization(self, *, payment_intent_id: str, key: str) -> Payment:
        """Release the hold: nothing is taken and nothing shows on the statement. One already
        released (by us, or lapsed) is the same success; a captured one must be refunded."""
        params: Any = {"cancellation_reason": "abandoned"}
        try:
            intent = _stripe(
                "cancel",
                "hold release",
                lambda: self._client.v1.payment_intents.cancel(
                    payment_intent_id, params, options={"idempotency_key": key}
                ),
            )
        except PermanentStepError:
            now = self.payment(payment_intent_id)
            if now.status == "canceled":
                return now
            raise
        return _payment(intent)

    def payment(self, payment_intent_id: str) -> Payment:
        """The payment intent as Stripe has it now: a consistent read (unlike search), so the
        reconcile of a capture or a hold release can trust what it says."""
        intent = _stripe(
            "payment read",
            "payment read",
            lambda: self._client.v1.payment_intents.retrieve(payment_intent_id),
        )
        return _payment(intent)

    def find_payment_by_key(self, key: str) -> Payment | None:
        """The payment made under `key`, if any. A read: no idempotency key needed."""
        query = f"metadata['idempotency_key']:'{_search_quote(key)}'"
        found = _stripe(
            "payment lookup",
            "payment lookup",
            lambda: self._client.v1.payment_intents.search({"query": query}),
        )
        intents = [i for i in found.data if i.metadata.to_dict().get("idempotency_key") == key]
        return _payment(intents[0]) if intents else None

    def find_refund_by_key(self, *, payment_intent_id: str, key: str) -> Refund | None:
        """The refund made under `key` for this payment, if any: Stripe's refund list is
        consistent (a refund shows the moment it exists), so an absence is an answer."""
        # One page of 100: a payment is refunded a handful of times at most, and each further
        # page would be a request of its own.
        found = _stripe(
            "refund lookup",
            "refund lookup",
            lambda: self._client.v1.refunds.list(
                {"payment_intent": payment_intent_id, "limit": 100}
            ),
        )
        for refund in found.data:
            metadata = refund.metadata.to_dict() if refund.metadata else {}
            if metadata.get("idempotency_key") == key:
                return _refund(refund, payment_intent_id)
        return None

    def refund(
        self, *, payment_intent_id: str, amount_cents: int, key: str, workflow_id: str
    ) -> Refund:
        params: Any = {
            "payment_intent": payment_intent_id,
            "amount": amount_cents,
            "metadata": {"idempotency_key": key, "workflow_id": workflow_id},
        }
        refund = _stripe(
            "refund",
            "refund",
            lambda: self._client.v1.refunds.create(params, options={"idempotency_key": key}),
        )
        return _refund(refund, payment_intent_id)

    def payments_created(
        self, start: int, end: int, *, page_size: int = LIST_PAGE_SIZE
    ) -> list[dict[str, Any]]:
        """Every payment intent created in [start, end) (seconds since the epoch), page by
        page: `{"id", "amount_cents", "amount_received_cents", "status", "created",
        "workflow_id"}`. A read: each page one request, retried like any other."""
        intents = self._list(self._client.v1.payment_intents.list, start, end, page_size)
        return [
            {
                "id": intent["id"],
                "amount_cents": intent["amount"],
                "amount_received_cents": intent.get("amount_received") or 0,
                "status": intent["status"],
                "created": intent["created"],
                "workflow_id": (intent.get("metadata") or {}).get("workflow_id", ""),
            }
            for intent in intents
        ]

    def refunds_created(
        self, start: int, end: int, *, page_size: int = LIST_PAGE_SIZE
    ) -> list[dict[str, Any]]:
        """Every refund created in [start, end): `{"id", "payment_intent_id", "amount_cents",
        "status", "created", "workflow_id"}`."""
        refunds = self._list(self._client.v1.refunds.list, start, end, page_size)
        return [
            {
                "id": refund["id"],
                "payment_intent_id": refund.get("payment_intent") or "",
                "amount_cents": refund["amount"],
                "status": refund.get("status") or "",
                "created": refund["created"],
                "workflow_id": (refund.get("metadata") or {}).get("workflow_id", ""),
            }
            for refund in refunds
        ]

    def _list(
        self, lister: Callable[..., Any], start: int, end: int, page_size: int
    ) -> list[dict[str, Any]]:
        """Stripe's list pages, newest first, followed by `starting_after` to the last."""
        found: list[dict[str, Any]] = []
        params: Any = {"created": {"gte": start, "lt": end}, "limit": page_size}
        while True:
            page = _stripe("list", "list", lambda params=params: lister(params))
            found += [item.to_dict() for item in page.data]
            if not page.has_more or not page.data:
                return found
            params = {**params, "starting_after": page.data[-1].id}


class HoldLapsed(PermanentStepError):
    """Your card's hold for the change fee ended before we finished: you have not been charged."""


def _refund(refund: Any, payment_intent_id: str) -> Refund:
    return Refund(
        id=refund.id,
        payment_intent_id=payment_intent_id,
        amount_cents=refund.amount,
        status=refund.status or "",
    )


def _payment(intent: Any) -> Payment:
    return Payment(
        id=intent.id, amount_cents=intent.amount, currency=intent.currency, status=intent.status
    )


def _search_quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _stripe(operation: str, action: str, send: Callable[[], Any]) -> Any:
    """One Stripe request, and the library's retries of it (a connection error, 409, 5xx,
    `Stripe-Should-Retry: true`) made here under the same key, each its own counted request."""
    for retry in range(STRIPE_NETWORK_RETRIES + 1):
        try:
            with partner_call("stripe", operation), _stripe_errors(action):
                return send()
        except (_UnavailableNow, _BusyNow):
            if retry == STRIPE_NETWORK_RETRIES:
                raise
        ceiling = min(STRIPE_RETRY_MAX_SECONDS, STRIPE_RETRY_BASE_SECONDS * 2**retry)
        time.sleep(max(STRIPE_RETRY_BASE_SECONDS, ceiling * random.uniform(0.5, 1.0)))
    raise AssertionError("unreachable")


class _UnavailableNow(PartnerUnavailable):
    """Unavailable, and the library would have tried again at once (`_stripe` does)."""


class _BusyNow(RetryableStepError):
    """A 409 or a lock: the library would have tried again at once (`_stripe` does)."""


@contextmanager
def _stripe_errors(action: str) -> Iterator[None]:
    """What Stripe said, and whether the same key may try again."""
    try:
        yield
    except stripe.CardError as exc:
        raise PermanentStepError(_decline_message(exc)) from exc
    except stripe.RateLimitError as exc:
        if exc.code == "lock_timeout" or _should_retry(exc.headers):
            # Another request holds the object's lock: not the limiter.
            raise _BusyNow(f"Stripe is busy with this object ({action})") from exc
        raise PartnerRateLimited.from_headers(
            f"Stripe is rate limiting us ({action})", exc.headers
        ) from exc
    except stripe.IdempotencyError as exc:
        # Same key, different parameters: a bug in how we derive the request, not transient.
        raise PermanentStepError(
            f"Stripe refused the {action}: it does not match the earlier request under the "
            f"same idempotency key ({exc.user_message or exc})"
        ) from exc
    except stripe.APIConnectionError as exc:
        # The outcome is unknown; only the same key may ask again.
        unreachable = f"could not reach Stripe ({action}): {_first_line(exc.user_message)}"
        if exc.should_retry:
            raise _UnavailableNow(unreachable) from exc
        raise PartnerUnavailable(unreachable) from exc
    except stripe.APIError as exc:
        status = exc.http_status
        if status is None or status >= 500:
            failed = f"Stripe could not complete the {action} (HTTP {status})"
            if _should_retry(exc.headers) is False:
                raise PartnerUnavailable(failed) from exc
            raise _UnavailableNow(failed) from exc
        if status == 409:
            raise _BusyNow(f"Stripe could not complete the {action} (HTTP 409)") from exc
        raise PermanentStepError(f"Stripe refused the {action} (HTTP {status})") from exc
    except (stripe.AuthenticationError, stripe.PermissionError) as exc:
        raise PermanentStepError(
            f"Stripe rejected our credentials ({action}); an operator must fix the API key"
        ) from exc
    except stripe.StripeError as exc:  # InvalidRequestError and anything newer
        raise PermanentStepError(
            f"Stripe refused the {action}: {exc.user_message or exc.code or exc}"
        ) from exc


#: Decline codes that tell the holder something useful to fix. Every other one, above all
#: those revealing the card's state to whoever holds it (lost, stolen, fraudulent, pick up),
#: reaches the customer as the generic decline, as Stripe advises.
_TELLABLE_DECLINES = frozenset(
    {
        "insufficient_funds",
        "expired_card",
        "incorrect_cvc",
        "incorrect_number",
        "card_velocity_exceeded",
    }
)


def _decline_message(exc: stripe.CardError) -> str:
    reason = getattr(exc.error, "decline_code", None) if exc.error else None
    if reason in _TELLABLE_DECLINES:
        return f"Your card was declined ({reason.replace('_', ' ')})."
    return "Your card was declined."


def _first_line(text: str | None) -> str:
    """The library's messages run on with support advice; the first sentence says it."""
    return (text or "").strip().split("\n", 1)[0].split("  ", 1)[0].strip()


def _should_retry(headers: Any) -> bool | None:
    """Stripe's `Stripe-Should-Retry` header: True, False, or None when it says nothing."""
    value = headers.get("Stripe-Should-Retry") if headers else None
    return None if value is None else value == "true"


def _retry_after(headers: Any) -> float | None:
    try:
        return float(headers.get("Retry-After")) if headers else None
    except (TypeError, ValueError):
        return None


# --- airline and CRM (plain JSON over HTTP) --------------------------------------------------
class _PartnerHttp:
    """JSON over HTTP with timeouts always, the key header on effects, and our error mapping."""

    def __init__(
        self, base_url: str, *, partner: str, timeout: tuple[float, float] = HTTP_TIMEOUT_SECONDS
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.partner = partner
        self.timeout = timeout
        self.session = requests.Session()

    def call(
        self,
        method: str,
        path: str,
        *,
        not_found: PermanentStepError | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        """One traced, counted request (see `durable.partner_call`).

        A 404 the caller expects (`not_found`) is raised outside the count: "no such booking" is
        the partner's answer, not its error, and counting it would tell /metrics' readers which
        references exist.
        """
        slug = self.partner.removeprefix("the ").lower()
        with partner_call(slug, f"{method} {path.split('/')[1]}"):
            answer = self._call(method, path, expect_not_found=not_found is not None, **options)
        if answer is None:
            assert not_found is not None  # _call answers None only when told to expect a 404
            raise not_found
        return answer

    def _call(
        self,
        method: str,
        path: str,
        *,
        key: str | None = None,
        body: dict[str, Any] | None = None,
        query: dict[str, str] | None = None,
        expect_not_found: bool = False,
    ) -> dict[str, Any] | None:
        """The answer's JSON, or None for a 404 when `expect_not_found`."""
        headers = {"Idempotency-Key": key} if key else {}
        try:
            response = self.session.request(
                method,
                f"{self.base_url}{path}",
                json=body,
                params=query,
                headers=headers,
                timeout=self.timeout,
            )
        except requests.Timeout as exc:
            raise PartnerUnavailable(f"{self.partner} did not answer in time") from exc
        except requests.RequestException as exc:
            # Refused, reset, or dropped after the request was sent: the key makes a retry safe.
            raise PartnerUnavailable(
                f"could not reach {self.partner}: {type(exc).__name__}"
            ) from exc
        status = response.status_code
        if status == 404 and expect_not_found:
            return None
        if status == 429:
            raise PartnerRateLimited.from_headers(
                f"{self.partner} answered HTTP 429", response.headers
            )
        if status >= 500:
            raise PartnerUnavailable(
                f"{self.partner} answered HTTP {status}",
                retry_after_seconds=_retry_after(response.headers),
            )
        if status in (408, 409, 425):
            raise RetryableStepError(
                f"{self.partner} answered HTTP {status}",
                retry_after_seconds=_retry_after(response.headers),
            )
        if status >= 400:
            raise PermanentStepError(
                f"{self.partner} refused the request (HTTP {status}: {_error_code(response)})"
            )
        try:
            return response.json()
        except ValueError as exc:
            raise RetryableStepError(f"{self.partner} sent an unreadable answer") from exc


def _error_code(response: requests.Response) -> str:
    try:
        return str(response.json().get("error", "")) or response.reason
    except (ValueError, AttributeError):
        return response.reason


class AirlineGateway:
    def __init__(
        self, base_url: str, *, timeout: tuple[float, float] = HTTP_TIMEOUT_SECONDS
    ) -> None:
        self._http = _PartnerHttp(
            f"{base_url.rstrip('/')}/airline", partner="the airline", timeout=timeout
        )

    @classmethod
    def from_settings(cls) -> AirlineGateway:
        return cls(settings.SANDBOX_URL)

    def booking(self, reference: str) -> Booking:
        """The booking, or BookingNotFound (permanent)."""
        data = self._http.call(
            "GET", f"/bookings/{reference}", not_found=BookingNotFound(_not_found(reference))
        )
        fields = {name: data[name] for name in _BOOKING_FIELDS}
        passenger = data["passenger"]
        return Booking(
            passenger_name=passenger["name"],
            passenger_last_name=passenger["last_name"],
            seat_held=bool(data.get("seat_held", True)),
            **fields,
        )

    def scheduled_flight(self, flight: str, date: str) -> ScheduledFlight:
        """Whether the airline sells `flight` on `date` (ISO) today, from its schedule."""
        data = self._http.call("GET", "/schedule", query={"flight": flight, "date": date})
        return ScheduledFlight(
            flight=data["flight"],
            date=data["date"],
            operates=bool(data["operates"]),
            reason=str(data.get("reason", "")),
            last_bookable_date=str(data.get("last_bookable_date", "")),
        )

    def manifest(self, flight: str, date: str) -> dict[str, Any]:
        """A cancelled flight's passengers (`reference`, `last_name`, `email`) and the flight
        and date they were moved to (`rebooked_to`); PermanentStepError if it was not
        cancelled."""
        data = self._http.call(
            "GET",
            "/manifest",
            query={"flight": flight, "date": date},
            not_found=PermanentStepError(f"the airline did not cancel {flight} on {date}"),
        )
        return {
            "flight": data["flight"],
            "date": data["date"],
            "rebooked_to": dict(data["rebooked_to"]),
            "passengers": [
                {"reference": p["reference"], "last_name": p["last_name"], "email": p["email"]}
                for p in data["passengers"]
            ],
        }

    def cancel_seat(self, reference: str, *, key: str, workflow_id: str) -> SeatCancellation:
        data = self._http.call(
            "POST",
            f"/bookings/{reference}/cancel-seat",
            key=key,
            body={"workflow_id": workflow_id},
            not_found=PermanentStepError(_not_found(reference)),
        )
        return _seat_cancellation(data)

    def reinstate_seat(
        self, reference: str, *, cancellation_id: str, key: str, workflow_id: str
    ) -> SeatReinstatement:
        """Give the seat `cancellation_id` released back to the booking (once, whatever key)."""
        data = self._http.call(
            "POST",
            f"/bookings/{reference}/reinstate-seat",
            key=key,
            body={"workflow_id": workflow_id, "cancellation_id": cancellation_id},
            not_found=PermanentStepError(_not_found(reference)),
        )
        return _seat_reinstatement(data)

    def find_seat_reinstatement(self, *, key: str) -> SeatReinstatement | None:
        """The reinstatement made under `key`, if any (a consistent read: none means none)."""
        found = self._http.call("GET", "/seat-reinstatements", query={"idempotency_key": key})
        return _seat_reinstatement(found["data"][0]) if found.get("data") else None

    def find_seat_cancellation(self, *, key: str) -> SeatCancellation | None:
        """The seat cancellation made under `key`, if any (a consistent read: none means none)."""
        found = self._http.call("GET", "/seat-cancellations", query={"idempotency_key": key})
        return _seat_cancellation(found["data"][0]) if found.get("data") else None

    def find_boarding_pass(self, *, key: str) -> BoardingPass | None:
        """The boarding pass issued under `key`, if any (a consistent read: none means none)."""
        found = self._http.call("GET", "/boarding-passes", query={"idempotency_key": key})
        if not found.get("data"):
            return None
        data = found["data"][0]
        return _boarding_pass(data, data["reference"], data["flight"], data["date"])

    def issue_boarding_pass(
        self, reference: str, *, flight: str, date: str, key: str, workflow_id: str
    ) -> BoardingPass:
        data = self._http.call(
            "POST",
            "/boarding-passes",
            key=key,
            body={
                "reference": reference,
                "flight": flight,
                "date": date,
                "workflow_id": workflow_id,
            },
            not_found=PermanentStepError(_not_found(reference)),
        )
        return _boarding_pass(data, reference, flight, date)


def _seat_cancellation(data: dict[str, Any]) -> SeatCancellation:
    return SeatCancellation(
        cancellation_id=data["cancellation_id"],
        reference=data["reference"],
        seat=data["seat"],
        status=data["status"],
    )


def _seat_reinstatement(data: dict[str, Any]) -> SeatReinstatement:
    return SeatReinstatement(
        reinstatement_id=data["reinstatement_id"],
        cancellation_id=data["cancellation_id"],
        reference=data["reference"],
        seat=data["seat"],
        status=data["status"],
    )


def _boarding_pass(data: dict[str, Any], reference: str, flight: str, date: str) -> BoardingPass:
    return BoardingPass(
        boarding_pass_id=data["boarding_pass_id"],
        reference=data.get("reference", reference),
        flight=data.get("flight", flight),
        date=data.get("date", date),
        seat=data["seat"],
        barcode=data["barcode"],
    )


_BOOKING_FIELDS = (
    "reference",
    "contact_email",
    "flight",
    "date",
    "origin",
    "destination",
    "seat",
    "fare_class",
    "payment_method",
    "status",
)


class BookingNotFound(PermanentStepError):
    """The airline has no booking under that reference."""


def _not_found(reference: str) -> str:
    return f"We couldn't find booking {reference}."


class CrmGateway:
    def __init__(
        self, base_url: str, *, timeout: tuple[float, float] = HTTP_TIMEOUT_SECONDS
    ) -> None:
        self._http = _PartnerHttp(f"{base_url.rstrip('/')}/crm", partner="the CRM", timeout=timeout)

    @classmethod
    def from_settings(cls) -> CrmGateway:
        return cls(settings.SANDBOX_URL)

    def update(
        self, *, customer_email: str, reference: str, note: str, key: str, workflow_id: str
    ) -> str:
        """Record a note on the customer; returns the CRM's update id."""
        data = self._http.call(
            "POST",
            "/updates",
            key=key,
            body={
                "customer_email": customer_email,
                "reference": reference,
                "workflow_id": workflow_id,
                "note": note,
            },
        )
        return data["update_id"]

    def find_update(self, *, key: str) -> str | None:
        """The id of the update recorded under `key`, if any (none means none)."""
        found = self._http.call("GET", "/updates", query={"idempotency_key": key})
        return found["data"][0]["update_id"] if found.get("data") else None


# --- email ----------------------------------------------------------------------------------
MESSAGE_ID_DOMAIN = "agentflow.refunds"


def message_id_for(key: str) -> str:
    """The same key always yields the same Message-ID, so receivers can drop a resend."""
    return f"<{key}@{MESSAGE_ID_DOMAIN}>"


class Mailer:
    """Django's email with a deterministic Message-ID. SMTP has no idempotency: a crash after
    the server accepted the message resends it, under the same Message-ID."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        timeout_seconds: float,
        from_email: str,
        backend: str = "django.core.mail.backends.smtp.EmailBackend",
    ) -> None:
        self.host, self.port, self.timeout_seconds = host, port, timeout_seconds
        self.from_email = from_email
        self.backend = backend

    @classmethod
    def from_settings(cls) -> Mailer:
        return cls(
            host=settings.EMAIL_HOST,
            port=settings.EMAIL_PORT,
            timeout_seconds=settings.EMAIL_TIMEOUT,
            from_email=settings.DEFAULT_FROM_EMAIL,
            backend=settings.EMAIL_BACKEND,
        )

    def send(self, *, to: str, subject: str, body: str, key: str, workflow_id: str) -> str:
        """Send one plain-text message; returns its Message-ID.

        An address or header that cannot be encoded is refused before connecting, as a
        permanent error: nothing was sent, and no retry could encode it.
        """
        with partner_call("smtp", "send"):
            return self._send(to=to, subject=subject, body=body, key=key, workflow_id=workflow_id)

    def _send(self, *, to: str, subject: str, body: str, key: str, workflow_id: str) -> str:
        message_id = message_id_for(key)
        if smtp_problem(to):
            raise PermanentStepError("We can't send email to the address on the booking.")
        connection = get_connection(
            self.backend, host=self.host, port=self.port, timeout=self.timeout_seconds
        )
        message = EmailMessage(
            subject=subject,
            body=body,
            from_email=self.from_email,
            to=[to],
            headers={"Message-ID": message_id, "X-Agentflow-Workflow": workflow_id},
            connection=connection,
        )
        try:
            message.message()  # encodes every header now, before any connection
            message.send(fail_silently=False)
        except (UnicodeError, ValueError) as exc:  # raised while encoding, before sending
            raise PermanentStepError("The message could not be encoded for email.") from exc
        except smtplib.SMTPRecipientsRefused as exc:
            raise PermanentStepError("The mail server refused the address on the booking.") from exc
        except smtplib.SMTPResponseException as exc:
            if 500 <= exc.smtp_code < 600 and not isinstance(exc, smtplib.SMTPConnectError):
                raise PermanentStepError(
                    f"The mail server refused the message ({exc.smtp_code})"
                ) from exc
            raise RetryableStepError(f"the mail server answered {exc.smtp_code}") from exc
        except (smtplib.SMTPException, OSError) as exc:  # refused, reset, timed out
            raise RetryableStepError(f"could not reach the mail server: {exc!r}") from exc
        return message_id
