"""Each partner client against the real sandbox: success, replay under the same key, errors.

The real `stripe` library, real HTTP and real SMTP; counts are taken from the sandbox's ledger,
the partner's side of the story.
"""

from __future__ import annotations

import socket
from datetime import date

import pytest

from agentflow.durable import PermanentStepError, RetryableStepError
from refunds.gateways import (
    AirlineGateway,
    BookingNotFound,
    CrmGateway,
    Mailer,
    PaymentGateway,
    message_id_for,
)
from refunds.sandbox.airline import BOOKED_DAYS_AHEAD, HORIZON_DAYS, owner_of
from tests.support.airline_days import airline_today, new_flight
from tests.support.sandbox import SandboxProcess

WF = "wf_gatewaytest"


def key(seq: int, workflow_id: str = WF) -> str:
    return f"{workflow_id}_step_{seq}"


@pytest.fixture
def stripe_gw(clean_sandbox: SandboxProcess) -> PaymentGateway:
    return PaymentGateway(api_key="sk_test_gateways", api_base=clean_sandbox.url)


@pytest.fixture
def airline(clean_sandbox: SandboxProcess) -> AirlineGateway:
    return AirlineGateway(clean_sandbox.url)


def authorize(
    gateway: PaymentGateway, *, seq: int = 7, amount: int = 4500, pm: str = "pm_card_visa"
):
    return gateway.authorize(
        amount_cents=amount,
        currency="usd",
        payment_method=pm,
        description="Change fee for booking ABC123",
        key=key(seq),
        workflow_id=WF,
        metadata={"booking_reference": "ABC123"},
    )


def captured(gateway: PaymentGateway):
    """A fee held and then taken: what a refund gives back."""
    return gateway.capture(payment_intent_id=authorize(gateway).id, key=key(10))


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once the socket is closed


# --- Stripe ---------------------------------------------------------------------------------
def test_authorize__succeeds_with_key_and_workflow_in_metadata(stripe_gw, clean_sandbox) -> None:
    payment = authorize(stripe_gw)

    assert (payment.status, payment.amount_cents, payment.currency) == (
        "requires_capture",
        4500,
        "usd",
    )
    [entry] = clean_sandbox.ledger(workflow_id=WF)["authorizations"]
    assert entry["id"] == payment.id
    assert entry["idempotency_key"] == key(7)
    assert entry["metadata"] == {
        "booking_reference": "ABC123",
        "idempotency_key": key(7),
        "workflow_id": WF,
    }


def test_authorize__replay_with_same_key_returns_same_payment_once(
    stripe_gw, clean_sandbox
) -> None:
    first = authorize(stripe_gw)
    second = authorize(stripe_gw)

    assert second == first
    ledger = clean_sandbox.ledger(workflow_id=WF)
    assert len(ledger["authorizations"]) == 1
    assert ledger["replays"]["payment_intents.create"] == 1


def test_authorize__declined_card_is_permanent_and_readable(stripe_gw, clean_sandbox) -> None:
    with pytest.raises(PermanentStepError, match=r"^Your card was declined"):
        authorize(stripe_gw, pm="pm_card_chargeDeclined")
    with pytest.raises(PermanentStepError, match="insufficient funds"):
        authorize(stripe_gw, seq=8, pm="pm_card_chargeDeclinedInsufficientFunds")
    assert clean_sandbox.ledger(workflow_id=WF)["authorizations"] == []


@pytest.mark.parametrize(
    "pm",
    [
        "pm_card_chargeDeclinedStolenCard",
        "pm_card_chargeDeclinedLostCard",
        "pm_card_chargeDeclinedFraudulent",
    ],
)
def test_authorize__decline_revealing_card_state_is_the_generic_decline(stripe_gw, pm) -> None:
    """Whoever holds a stolen card must not learn from us that it was reported."""
    with pytest.raises(PermanentStepError) as raised:
        authorize(stripe_gw, pm=pm)
    assert str(raised.value) == "Your card was declined."


def test_authorize__same_key_other_amount_is_permanent_idempotency_error(stripe_gw) -> None:
    authorize(stripe_gw)
    with pytest.raises(PermanentStepError, match="same idempotency key"):
        authorize(stripe_gw, amount=4600)


def test_authorize__server_error_storm_is_retryable(stripe_gw, clean_sandbox) -> None:
    clean_sandbox.set_fault(endpoint="payment_intents.create", error_rate=1.0, error_status=500)

    with pytest.raises(RetryableStepError, match="HTTP 500"):
        authorize(stripe_gw)
    ledger = clean_sandbox.ledger()
    assert ledger["authorizations"] == []
    assert ledger["requests"]["payment_intents.create"] == 3  # the library's 2 retries, same key


def test_authorize__rate_limit_is_retryable(stripe_gw, clean_sandbox) -> None:
    clean_sandbox.set_fault(endpoint="payment_intents.create", error_rate=1.0, error_status=429)
    with pytest.raises(RetryableStepError, match="rate limiting"):
        authorize(stripe_gw)


def test_authorize__dropped_answer_is_retried_by_library_into_one_payment(
    stripe_gw, clean_sandbox
) -> None:
    # The network dies after Stripe charged: the library asks again with the same key.
    clean_sandbox.set_fault(endpoint="payment_intents.create", drop_rate=1.0, count=1)

    payment = authorize(stripe_gw)

    ledger = clean_sandbox.ledger(workflow_id=WF)
    assert [p["id"] for p in ledger["authorizations"]] == [payment.id]
    assert ledger["replays"]["payment_intents.create"] == 1


def test_authorize__every_answer_dropped_is_retryable_then_same_key_adopts_it(
    stripe_gw, clean_sandbox
) -> None:
    clean_sandbox.set_fault(endpoint="payment_intents.create", drop_rate=1.0)
    with pytest.raises(RetryableStepError, match="could not reach Stripe"):
        authorize(stripe_gw)
    clean_sandbox.clear_faults()

    payment = authorize(stripe_gw)  # the engine's retry: same key

    assert [p["id"] for p in clean_sandbox.ledger(workflow_id=WF)["authorizations"]] == [payment.id]


def test_authorize__stripe_unreachable_is_retryable() -> None:
    gateway = PaymentGateway(api_key="sk_test_x", api_base=f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(RetryableStepError, match="could not reach Stripe"):
        gateway.authorize(
            amount_cents=100,
            currency="usd",
            payment_method="pm_card_visa",
            description="x",
            key=key(7),
            workflow_id=WF,
        )


def test_authorize__bad_api_key_is_permanent(clean_sandbox) -> None:
    gateway = PaymentGateway(api_key="sk_live_wrong", api_base=clean_sandbox.url)
    with pytest.raises(PermanentStepError, match="credentials"):
        authorize(gateway)


def test_find_payment_by_key__finds_the_payment_made_under_the_key(stripe_gw) -> None:
    payment = authorize(stripe_gw)
    authorize(stripe_gw, seq=70)  # another key's payment is not mistaken for it

    assert stripe_gw.find_payment_by_key(key(7)) == payment
    assert stripe_gw.find_payment_by_key(key(99)) is None


def test_refund__replay_with_same_key_refunds_once(stripe_gw, clean_sandbox) -> None:
    payment = captured(stripe_gw)

    refunds = [
        stripe_gw.refund(
            payment_intent_id=payment.id, amount_cents=4500, key=key(11), workflow_id=WF
        )
        for _ in range(2)
    ]

    assert refunds[0] == refunds[1]
    assert refunds[0].payment_intent_id == payment.id
    [entry] = clean_sandbox.ledger(workflow_id=WF)["refunds"]
    assert (entry["id"], entry["idempotency_key"], entry["amount"]) == (
        refunds[0].id,
        key(11),
        4500,
    )


def test_find_refund_by_key__finds_the_refund_made_under_the_key(stripe_gw) -> None:
    payment = captured(stripe_gw)
    made = stripe_gw.refund(
        payment_intent_id=payment.id, amount_cents=1000, key=key(11), workflow_id=WF
    )
    stripe_gw.refund(payment_intent_id=payment.id, amount_cents=500, key=key(12), workflow_id=WF)

    assert stripe_gw.find_refund_by_key(payment_intent_id=payment.id, key=key(11)) == made
    assert stripe_gw.find_refund_by_key(payment_intent_id=payment.id, key=key(99)) is None


# --- airline --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reference", "fare_class", "payment_method"),
    [
        ("ABC123", "standard", "pm_card_visa"),
        ("FLX123", "flex", "pm_card_visa"),
        ("BAS123", "basic", "pm_card_visa"),
        ("DEC123", "standard", "pm_card_chargeDeclined"),
        ("STL123", "standard", "pm_card_chargeDeclinedStolenCard"),
    ],
)
def test_booking__is_derived_from_reference(airline, reference, fare_class, payment_method) -> None:
    booking = airline.booking(reference)
    assert (booking.reference, booking.fare_class, booking.payment_method) == (
        reference,
        fare_class,
        payment_method,
    )
    assert booking.passenger_name and booking.seat and booking.flight
    owner = owner_of(reference)
    assert (booking.passenger_last_name, booking.contact_email) == (owner.last_name, owner.email)
    assert booking.passenger_name.endswith(owner.last_name)
    assert airline.booking(reference) == booking
    # In the airline's calendar: at least a week ahead of its today, and on sale.
    ahead = (date.fromisoformat(booking.date) - airline_today()).days
    assert BOOKED_DAYS_AHEAD[0] <= ahead <= HORIZON_DAYS, booking.date


def test_booking__unknown_reference_is_booking_not_found(airline, clean_sandbox) -> None:
    clean_sandbox.set_fault(unknown_bookings=["NOP123"])
    with pytest.raises(BookingNotFound, match=r"^We couldn't find booking NOP123"):
        airline.booking("NOP123")


def test_booking__airline_unreachable_is_retryable() -> None:
    with pytest.raises(RetryableStepError, match="could not reach the airline"):
        AirlineGateway(f"http://127.0.0.1:{closed_port()}").booking("ABC123")


def test_booking__slow_airline_times_out_retryably(clean_sandbox) -> None:
    clean_sandbox.set_fault(endpoint="airline.booking", latency_ms=2000)
    impatient = AirlineGateway(clean_sandbox.url, timeout=(1.0, 0.3))
    with pytest.raises(RetryableStepError, match="did not answer in time"):
        impatient.booking("ABC123")


def test_cancel_seat__replay_with_same_key_cancels_once(airline, clean_sandbox) -> None:
    first = airline.cancel_seat("ABC123", key=key(6), workflow_id=WF)
    second = airline.cancel_seat("ABC123", key=key(6), workflow_id=WF)

    assert second == first
    assert (first.status, first.seat) == ("released", airline.booking("ABC123").seat)
    [entry] = clean_sandbox.ledger(workflow_id=WF)["seat_cancellations"]
    assert (entry["id"], entry["idempotency_key"]) == (first.cancellation_id, key(6))


def test_cancel_seat__dropped_answer_is_retryable_then_replayed(airline, clean_sandbox) -> None:
    clean_sandbox.set_fault(endpoint="airline.cancel_seat", drop_rate=1.0, count=1)
    with pytest.raises(RetryableStepError):
        airline.cancel_seat("ABC123", key=key(6), workflow_id=WF)

    again = airline.cancel_seat("ABC123", key=key(6), workflow_id=WF)

    [entry] = clean_sandbox.ledger(workflow_id=WF)["seat_cancellations"]
    assert entry["id"] == again.cancellation_id


def test_boarding_pass__replay_with_same_key_issues_once(airline, clean_sandbox) -> None:
    new = new_flight()
    issue = dict(flight="SK1240", date=new.date, key=key(8), workflow_id=WF)
    first = airline.issue_boarding_pass("ABC123", **issue)
    assert airline.issue_boarding_pass("ABC123", **issue) == first
    assert (first.flight, first.date) == ("SK1240", new.date)
    [entry] = clean_sandbox.ledger(workflow_id=WF)["boarding_passes"]
    assert (entry["id"], entry["idempotency_key"]) == (first.boarding_pass_id, key(8))


def test_find_seat_cancellation__finds_the_cancellation_made_under_the_key(airline) -> None:
    made = airline.cancel_seat("ABC123", key=key(6), workflow_id=WF)
    airline.cancel_seat("XYZ789", key=key(6, "wf_other"), workflow_id="wf_other")

    assert airline.find_seat_cancellation(key=key(6)) == made
    assert airline.find_seat_cancellation(key=key(99)) is None


def test_find_boarding_pass__finds_the_pass_issued_under_the_key(airline) -> None:
    made = airline.issue_boarding_pass(
        "ABC123", flight="SK1240", date=new_flight().date, key=key(8), workflow_id=WF
    )

    assert airline.find_boarding_pass(key=key(8)) == made
    assert airline.find_boarding_pass(key=key(99)) is None


def test_boarding_pass__server_error_storm_is_retryable(airline, clean_sandbox) -> None:
    clean_sandbox.set_fault(endpoint="airline.boarding_pass", error_rate=1.0, error_status=500)
    with pytest.raises(RetryableStepError, match="HTTP 500"):
        airline.issue_boarding_pass(
            "ABC123", flight="SK1240", date=new_flight().date, key=key(8), workflow_id=WF
        )
    assert clean_sandbox.ledger()["boarding_passes"] == []


# --- CRM ------------------------------------------------------------------------------------
def test_crm_update__replay_with_same_key_records_once(clean_sandbox) -> None:
    crm = CrmGateway(clean_sandbox.url)
    update = dict(customer_email="ada@example.com", reference="ABC123", note="Rebooked")
    first = crm.update(**update, key=key(9), workflow_id=WF)
    assert crm.update(**update, key=key(9), workflow_id=WF) == first
    [entry] = clean_sandbox.ledger(workflow_id=WF)["crm_updates"]
    assert (entry["id"], entry["idempotency_key"], entry["note"]) == (first, key(9), "Rebooked")


def test_crm_find_update__finds_the_update_recorded_under_the_key(clean_sandbox) -> None:
    crm = CrmGateway(clean_sandbox.url)
    made = crm.update(
        customer_email="ada@example.com",
        reference="ABC123",
        note="Rebooked",
        key=key(9),
        workflow_id=WF,
    )

    assert crm.find_update(key=key(9)) == made
    assert crm.find_update(key=key(99)) is None


# --- email ----------------------------------------------------------------------------------
def mailer(port: int) -> Mailer:
    return Mailer(host="127.0.0.1", port=port, timeout_seconds=5, from_email="desk@example.com")


def send(mail: Mailer) -> str:
    return mail.send(
        to="ada@example.com", subject="Confirmed", body="Hi", key=key(10), workflow_id=WF
    )


def test_mailer__records_deterministic_message_id_and_workflow(clean_sandbox) -> None:
    message_id = send(mailer(clean_sandbox.smtp_port))

    assert message_id == message_id_for(key(10)) == f"<{key(10)}@agentflow.refunds>"
    [email] = clean_sandbox.ledger(workflow_id=WF)["emails"]
    assert (email["message_id"], email["to"], email["deliveries"]) == (
        message_id,
        ["ada@example.com"],
        1,
    )


def test_mailer__resend_has_same_message_id(clean_sandbox) -> None:
    # SMTP has no idempotency: a resend is a second delivery of the same message, not a new one.
    mail = mailer(clean_sandbox.smtp_port)
    send(mail)
    send(mail)
    [email] = clean_sandbox.ledger(workflow_id=WF)["emails"]
    assert email["deliveries"] == 2


def test_mailer__temporary_smtp_failure_is_retryable(clean_sandbox) -> None:
    clean_sandbox.set_fault(endpoint="smtp", error_rate=1.0)
    with pytest.raises(RetryableStepError, match="451"):
        send(mailer(clean_sandbox.smtp_port))
    assert clean_sandbox.ledger()["emails"] == []


def test_mailer__smtp_down_is_retryable() -> None:
    with pytest.raises(RetryableStepError, match="could not reach the mail server"):
        send(mailer(closed_port()))


@pytest.mark.parametrize(
    "address",
    [
        pytest.param("ana@exa\u200fmple.com", id="bidi-mark"),
        pytest.param("ana@ex\u2028ample.com", id="line-separator"),
        pytest.param("ana@\u3002example.com", id="bad-idna"),
    ],
)
def test_mailer__address_that_cannot_be_encoded_is_permanent_and_sends_nothing(
    clean_sandbox, address: str
) -> None:
    mail = mailer(clean_sandbox.smtp_port)
    with pytest.raises(PermanentStepError, match="can't send email"):
        mail.send(to=address, subject="Hi", body="Hi", key=key(10), workflow_id=WF)
    assert clean_sandbox.ledger()["emails"] == []


def test_mailer__header_that_cannot_be_encoded_is_permanent(clean_sandbox) -> None:
    mail = mailer(clean_sandbox.smtp_port)
    with pytest.raises(PermanentStepError, match="could not be encoded"):
        mail.send(
            to="ada@example.com", subject="Hi\nBcc: x@y.z", body="Hi", key=key(10), workflow_id=WF
        )
    assert clean_sandbox.ledger()["emails"] == []
