"""The SMTP sink, the control endpoints, and state that survives a kill -9."""

from __future__ import annotations

import smtplib
import threading
from email.message import EmailMessage

import pytest
import requests

from agentflow.testing.waiting import wait_for
from tests.refunds.integration.sandbox.clients import intent_params, make_stripe_client


def _email(message_id: str, workflow_id: str) -> EmailMessage:
    message = EmailMessage()
    message["Message-ID"] = message_id
    message["X-Agentflow-Workflow"] = workflow_id
    message["From"] = "rebooking@agentflow.test"
    message["To"] = "customer@example.test"
    message["Subject"] = "Your new boarding pass"
    message.set_content("See you on board.")
    return message


def _send(sandbox, message: EmailMessage) -> None:
    with smtplib.SMTP("127.0.0.1", sandbox.smtp_port, timeout=10) as smtp:
        smtp.send_message(message)


def test_smtp__same_message_id_twice_is_one_email_with_two_deliveries(clean_sandbox):
    message = _email("<wf-mail.confirm@agentflow.test>", "wf-mail")

    _send(clean_sandbox, message)
    _send(clean_sandbox, message)
    _send(clean_sandbox, _email("<other@agentflow.test>", "wf-other"))

    ledger = clean_sandbox.ledger(workflow_id="wf-mail")
    [email] = ledger["emails"]
    assert email["message_id"] == email["idempotency_key"] == "<wf-mail.confirm@agentflow.test>"
    assert email["deliveries"] == 2
    assert email["to"] == ["customer@example.test"]
    assert email["subject"] == "Your new boarding pass"
    assert ledger["duplicate_email_deliveries"] == 1
    assert clean_sandbox.ledger()["requests"]["smtp"] == 3


def test_smtp__injected_fault_is_a_temporary_failure_then_accepts(clean_sandbox):
    clean_sandbox.set_fault(endpoint="smtp", error_rate=1, count=1)
    message = _email("<retry@agentflow.test>", "wf-mail-retry")

    with pytest.raises(smtplib.SMTPDataError) as raised:
        _send(clean_sandbox, message)
    _send(clean_sandbox, message)

    assert raised.value.smtp_code == 451
    [email] = clean_sandbox.ledger()["emails"]
    assert email["deliveries"] == 1


def test_smtp__dropped_answer_still_records_the_email(clean_sandbox):
    clean_sandbox.set_fault(endpoint="smtp", drop_rate=1, count=1)
    message = _email("<dropped@agentflow.test>", "wf-mail-drop")

    with pytest.raises(smtplib.SMTPServerDisconnected):
        _send(clean_sandbox, message)
    _send(clean_sandbox, message)

    [email] = clean_sandbox.ledger()["emails"]
    assert email["deliveries"] == 2


def test_faults__shown_validated_and_cleared(clean_sandbox):
    shown = clean_sandbox.set_fault(endpoint="airline.booking", latency_ms=5, count=3)
    bad = requests.post(
        f"{clean_sandbox.url}/_sandbox/faults", json={"endpoint": "nope"}, timeout=10
    )

    assert shown["faults"]["airline.booking"]["count"] == 3
    assert bad.status_code == 400
    assert requests.get(f"{clean_sandbox.url}/_sandbox/faults", timeout=10).json() == shown
    clean_sandbox.clear_faults()
    assert requests.get(f"{clean_sandbox.url}/_sandbox/faults", timeout=10).json() == {
        "faults": {},
        "unknown_bookings": [],
        "held": {},
    }


def _booking_in_thread(sandbox, reference: str, answers: list[int]) -> threading.Thread:
    def get() -> None:
        url = f"{sandbox.url}/airline/bookings/{reference}"
        answers.append(requests.get(url, timeout=60).status_code)

    thread = threading.Thread(target=get)
    thread.start()
    return thread


def _held(sandbox) -> int:
    faults = requests.get(f"{sandbox.url}/_sandbox/faults", timeout=10).json()
    return faults["held"].get("airline.booking", 0)


def test_barrier__holds_each_read_until_the_others_arrive_then_answers_all(clean_sandbox):
    clean_sandbox.set_fault(endpoint="airline.booking", barrier=3, count=3)
    answers: list[int] = []
    threads = [_booking_in_thread(clean_sandbox, "AGR001", answers) for _ in range(2)]
    wait_for(lambda: _held(clean_sandbox) == 2, timeout=30, what="two reads held")
    assert answers == []  # held, both, until the third arrives

    threads.append(_booking_in_thread(clean_sandbox, "AGR001", answers))
    for thread in threads:
        thread.join(timeout=30)

    assert answers == [200, 200, 200]
    assert _held(clean_sandbox) == 0


def test_barrier__a_lonely_read_answers_at_its_deadline_and_clearing_releases_the_held(
    clean_sandbox,
):
    clean_sandbox.set_fault(endpoint="airline.booking", barrier=2, barrier_timeout_ms=1, count=1)
    lonely: list[int] = []
    _booking_in_thread(clean_sandbox, "AGR001", lonely).join(timeout=30)
    assert lonely == [200]  # nobody came: it answered anyway

    clean_sandbox.set_fault(endpoint="airline.booking", barrier=2, count=1)
    held: list[int] = []
    thread = _booking_in_thread(clean_sandbox, "AGR001", held)
    wait_for(lambda: _held(clean_sandbox) == 1, timeout=30, what="the read held")
    clean_sandbox.clear_faults()
    thread.join(timeout=30)
    assert held == [200]


def test_restart__state_survives_a_kill_and_keys_still_replay(clean_sandbox):
    client = make_stripe_client(clean_sandbox.url)
    intent = client.v1.payment_intents.create(
        intent_params("wf-restart"), options={"idempotency_key": "r"}
    )
    clean_sandbox.set_fault(unknown_bookings=["DED123"])

    clean_sandbox.restart()

    client = make_stripe_client(clean_sandbox.url)
    again = client.v1.payment_intents.create(
        intent_params("wf-restart"), options={"idempotency_key": "r"}
    )
    assert again.id == intent.id
    assert again.last_response.headers["Idempotent-Replayed"] == "true"
    assert [p["id"] for p in clean_sandbox.ledger(workflow_id="wf-restart")["payments"]] == [
        intent.id
    ]
    assert (
        requests.get(f"{clean_sandbox.url}/airline/bookings/DED123", timeout=10).status_code == 404
    )


def test_ledger__workflow_filter_applies_to_every_list(clean_sandbox):
    client = make_stripe_client(clean_sandbox.url)
    client.v1.payment_intents.create(intent_params("wf-x"), options={"idempotency_key": "x"})
    client.v1.payment_intents.create(intent_params("wf-y"), options={"idempotency_key": "y"})
    requests.post(
        f"{clean_sandbox.url}/crm/updates",
        json={"customer_email": "a@b.test", "reference": "ABC123", "workflow_id": "wf-y"},
        headers={"Idempotency-Key": "crm-y"},
        timeout=10,
    )

    only_x = clean_sandbox.ledger(workflow_id="wf-x")

    assert [p["workflow_id"] for p in only_x["payments"]] == ["wf-x"]
    assert only_x["crm_updates"] == []
    assert len(clean_sandbox.ledger()["payments"]) == 2
