"""The customer pages through Django's test client on real Postgres: form, status, bad input."""

from __future__ import annotations

import html
import itertools
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.core import signing
from django.test import Client, override_settings
from django.utils import timezone

from agentflow.models import StepCheckpoint, WorkflowRun
from refunds import forms
from refunds.models import RefundRequest
from refunds.sandbox.airline import owner_of

pytestmark = pytest.mark.django_db

NEW_URL = "/refunds/new/"
OWNER = owner_of("ABC123")
VALID = {
    "email": OWNER.email,
    "booking_reference": "abc123",
    "last_name": OWNER.last_name,
    "message": "Please move me to the 18:05 flight to Oslo on 14 March.",
}


# --- helpers ------------------------------------------------------------------------------------
_requests = itertools.count(1)


def counts() -> tuple[int, int]:
    return RefundRequest.objects.count(), WorkflowRun.objects.count()


@pytest.fixture
def unchanged() -> Iterator[None]:
    """Asserts the test created no request and no run."""
    before = counts()
    yield
    assert counts() == before


def token_in(page: str) -> str:
    match = re.search(r'name="submission_token" value="([^"]+)"', page)
    assert match, "the form carries no submission token"
    return html.unescape(match.group(1))


def fresh_token(client: Client) -> str:
    return token_in(client.get(NEW_URL).content.decode())


def submit(client: Client, token: str | None = None, *, ip: str = "203.0.113.7", **fields: str):
    data = {**VALID, **fields}
    if token is not None:
        data["submission_token"] = token
    return client.post(NEW_URL, data, REMOTE_ADDR=ip)


def old_token(age_seconds: int) -> str:
    """A genuine token signed `age_seconds` ago."""

    class Backdated(signing.TimestampSigner):
        def timestamp(self) -> str:
            return signing.b62_encode(int(timezone.now().timestamp()) - age_seconds)

    return Backdated(salt=forms.TOKEN_SALT).sign("A" * 32)


def add_step(
    run_id: str, seq: int, name: str, status: str, *, error: str = "", attempts: int = 1
) -> StepCheckpoint:
    now = timezone.now()
    return StepCheckpoint.objects.create(
        run_id=run_id,
        seq=seq,
        name=name,
        kind="effect",
        status=status,
        attempts=attempts,
        idempotency_key=f"{run_id}:{seq}:{name}:key",
        error=error,
        output={"secret": "internal-output-value"},
        first_started_at=now,
        started_at=now,
        finished_at=now if status != "IN_PROGRESS" else None,
        lease_expires_at=now + timedelta(seconds=30) if status == "IN_PROGRESS" else None,
        lease_owner="worker-7@host" if status == "IN_PROGRESS" else "",
    )


def create_refund(client: Client, *, ip: str = "203.0.113.7", **fields: str) -> RefundRequest:
    """A new request each call: the words differ, so it is not a resubmission of an earlier one."""
    fields.setdefault("message", f"{VALID['message']} (request {next(_requests)})")
    response = submit(client, fresh_token(client), ip=ip, **fields)
    assert response.status_code == 303, response.content.decode()[:2000]
    return RefundRequest.objects.get(public_id=response["Location"].split("/")[2])


# --- the form -----------------------------------------------------------------------------------
def test_new_form__has_labelled_fields_and_a_signed_token(client: Client) -> None:
    response = client.get(NEW_URL)
    page = response.content.decode()
    assert response.status_code == 200
    for name in ("booking_reference", "last_name", "email", "message"):
        assert f'<label class="field__label" for="id_{name}">' in page
        assert f'id="id_{name}"' in page
    assert forms.unsign_submission_token(token_in(page)) is not None
    assert "csrfmiddlewaretoken" in page
    assert 'name="viewport"' in page
    assert "/static/refunds/site.css" in page
    # Fetched afresh on each visit, yet kept for the back button (no `no-store`).
    assert {"private", "max-age=0"} <= set(response["Cache-Control"].replace(" ", "").split(","))
    assert "no-store" not in response["Cache-Control"]


def test_new_form__each_rendering_gets_its_own_token(client: Client) -> None:
    assert fresh_token(client) != fresh_token(client)


def test_submit__creates_request_and_run_then_303_to_status_page(client: Client) -> None:
    response = submit(client, fresh_token(client))
    assert response.status_code == 303
    refund = RefundRequest.objects.get()
    assert response["Location"] == f"/refunds/{refund.public_id}/"
    assert refund.booking_reference == "ABC123"
    assert refund.email == VALID["email"]
    assert refund.message == VALID["message"]
    assert refund.client_ip == "203.0.113.7"
    run = WorkflowRun.objects.get()
    assert run.id == refund.workflow_id
    assert run.workflow == "refund"
    assert run.business_key == refund.public_id
    # Whose run it is (refunds.privacy): its customer, sealed in the row.
    assert run.input == {"refund_id": refund.public_id, "customer": VALID["email"].lower()}
    page = client.get(response["Location"])
    assert page.status_code == 200
    assert "ABC123" in page.content.decode()


def test_submit__message_of_exactly_5000_characters_is_accepted(client: Client) -> None:
    refund = create_refund(client, message="x" * 5000)
    assert len(refund.message) == 5000


def test_submit__crlf_line_breaks_count_as_one_character(client: Client) -> None:
    typed = ("a" * 99 + "\r\n") * 49 + "a" * 100  # 5,000 characters as a browser counts
    refund = create_refund(client, message=typed)
    assert len(refund.message) == 5000
    assert "\r" not in refund.message


def test_submit__email_domain_is_lower_cased(client: Client) -> None:
    refund = create_refund(client, email="Ana.Lopez@Example.COM")
    assert refund.email == "Ana.Lopez@example.com"


# --- one-time token -----------------------------------------------------------------------------
def test_double_submit__same_token_gives_the_same_refund(client: Client) -> None:
    token = fresh_token(client)
    first = submit(client, token)
    second = submit(client, token)
    assert first.status_code == second.status_code == 303
    assert first["Location"] == second["Location"]
    assert counts() == (1, 1)


def test_reused_token__different_fields_keep_the_first_refund_and_say_so(client: Client) -> None:
    token = fresh_token(client)
    first = submit(client, token)
    second = submit(client, token, booking_reference="ZZZ999", message="Something else.")
    assert second.status_code == 303
    assert second["Location"] == first["Location"]
    assert counts() == (1, 1)
    assert RefundRequest.objects.get().booking_reference == "ABC123"
    page = client.get(second["Location"]).content.decode()
    assert "already sent this form" in page


def test_reused_token__even_with_invalid_fields_goes_to_the_first_refund(client: Client) -> None:
    token = fresh_token(client)
    first = submit(client, token)
    second = submit(client, token, email="not-an-email", message="")
    assert second.status_code == 303
    assert second["Location"] == first["Location"]
    assert counts() == (1, 1)


@pytest.mark.parametrize(
    "token",
    [
        pytest.param(None, id="missing"),
        pytest.param("", id="empty"),
        pytest.param("A" * 32, id="unsigned-nonce"),
        pytest.param("tampered", id="tampered"),
        pytest.param("expired", id="expired"),
        pytest.param("x" * 5000, id="huge"),
        pytest.param("\u00e9\u2603\U0001f600:abc:def", id="unicode"),
    ],
)
def test_bad_token__400_page_asks_to_send_again_and_keeps_input(
    client: Client, unchanged: None, token: str | None
) -> None:
    if token == "tampered":
        good = fresh_token(client)
        token = good[:-1] + ("A" if good[-1] != "A" else "B")
    elif token == "expired":
        token = old_token(forms.TOKEN_MAX_AGE_SECONDS + 60)
    response = submit(client, token, message="My own words, kept.")
    page = response.content.decode()
    assert response.status_code == 400
    assert "Please send the form again" in page
    assert "My own words, kept." in page
    assert f'value="{VALID["email"]}"' in page
    assert forms.unsign_submission_token(token_in(page)) is not None  # a fresh one to resend


def test_bad_token__resending_the_kept_form_creates_the_refund(client: Client) -> None:
    page = submit(client, "tampered").content.decode()
    response = submit(client, token_in(page))
    assert response.status_code == 303
    assert counts() == (1, 1)


def test_token__younger_than_max_age_is_accepted(client: Client) -> None:
    response = submit(client, old_token(forms.TOKEN_MAX_AGE_SECONDS - 60))
    assert response.status_code == 303


# --- field errors -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("email", "not-an-email", "Enter an email address like name@example.com."),
        ("email", "a@b", "Enter an email address like name@example.com."),
        ("email", "", "Enter your email address."),
        ("email", "x" * 250 + "@example.com", "too long"),
        ("booking_reference", "ABC12", "exactly 6 letters and numbers"),
        ("booking_reference", "ABC1234", "exactly 6 letters and numbers"),
        ("booking_reference", "AB-123", "exactly 6 letters and numbers"),
        ("booking_reference", "ÅBC123", "exactly 6 letters and numbers"),
        ("booking_reference", "A" * 500, "exactly 6 letters and numbers"),
        ("booking_reference", "", "Enter your booking reference."),
        ("last_name", "", "Enter the passenger&#x27;s last name."),
        ("last_name", "   ", "Enter the passenger&#x27;s last name."),
        ("last_name", "12 - 3", "Enter the passenger&#x27;s last name."),
        ("last_name", "x" * 101, "longer than we can check"),
        ("email", "ana@exa\u200fmple.com", "hidden direction marks"),
        ("email", "ana@ex\u2028ample.com", "hidden characters"),
        ("email", "ana@\u3002example.com", "We can&#x27;t send email to that address"),
        ("message", "", "Tell us what you&#x27;d like to change."),
        ("message", "   \n  ", "Tell us what you&#x27;d like to change."),
        ("message", "x" * 5001, "5,000 characters or fewer (it has 5001)"),
        ("message", "nul \x00 byte", "Null characters are not allowed."),
    ],
)
def test_bad_field__friendly_error_linked_to_the_input_and_input_kept(
    client: Client, unchanged: None, field: str, value: str, words: str
) -> None:
    response = submit(client, fresh_token(client), **{field: value})
    page = response.content.decode()
    assert response.status_code == 400
    assert words in page
    assert f'id="id_{field}_error"' in page
    widget = re.search(rf"<(?:input|textarea)[^>]*id=\"id_{field}\"[^>]*>", page)
    assert widget, page
    assert 'aria-invalid="true"' in widget.group(0)
    assert f"id_{field}_error" in widget.group(0)  # aria-describedby names the error
    assert f'href="#id_{field}"' in page  # the error summary links to the field
    if field != "email":
        assert f'value="{VALID["email"]}"' in page
    if field != "message":
        assert VALID["message"] in page


def test_bad_field__rerendered_form_keeps_its_token_so_resubmits_dedupe(client: Client) -> None:
    token = fresh_token(client)
    page = submit(client, token, email="nope").content.decode()
    assert token_in(page) == token
    first = submit(client, token)
    second = submit(client, token)
    assert first["Location"] == second["Location"]
    assert counts() == (1, 1)


# --- garbage bodies -----------------------------------------------------------------------------
GARBAGE = [
    pytest.param(bytes(range(256)) * 8, "application/x-www-form-urlencoded", id="binary-form"),
    pytest.param(b"\xff\xfe\x00garbage\x80\x81", "application/octet-stream", id="octet-stream"),
    pytest.param(b'{"email": "a@b.c"}', "application/json", id="json"),
    pytest.param(b"--x\r\nnonsense", "multipart/form-data", id="multipart-no-boundary"),
    pytest.param(b"\x00\x01--zz\r\n\xff", "multipart/form-data; boundary=zz", id="multipart-junk"),
    pytest.param(
        b"email=%FF%FE%FD&booking_reference=%C3%28%A0&message=%80%81&submission_token=%FF",
        "application/x-www-form-urlencoded",
        id="non-utf8",
    ),
    pytest.param(
        b"message=" + b"x" * (3 * 1024 * 1024), "application/x-www-form-urlencoded", id="huge"
    ),
    pytest.param(
        "&".join(f"f{i}=1" for i in range(1200)).encode(),
        "application/x-www-form-urlencoded",
        id="too-many-fields",
    ),
    pytest.param(
        b"email=a%40b.c&message=hi",
        "application/x-www-form-urlencoded; charset=bogus-charset",
        id="bogus-charset",
    ),
    pytest.param(
        b"\xff\xfe\x00e\x00m\xd8\x00=\x00\x01",
        "application/x-www-form-urlencoded; charset=utf-16",
        id="broken-utf16",
    ),
]


@pytest.mark.parametrize(("body", "content_type"), GARBAGE)
def test_garbage_body__friendly_4xx_and_nothing_created(
    client: Client, unchanged: None, body: bytes, content_type: str
) -> None:
    response = client.generic("POST", NEW_URL, body, content_type=content_type)
    assert 400 <= response.status_code < 500
    page = response.content.decode()
    assert "Skyways" in page
    assert "Traceback" not in page


@pytest.mark.parametrize(("body", "content_type"), GARBAGE)
def test_garbage_body_with_csrf_on__friendly_4xx_and_nothing_created(
    unchanged: None, body: bytes, content_type: str
) -> None:
    client = Client(enforce_csrf_checks=True)
    client.get(NEW_URL)
    response = client.generic("POST", NEW_URL, body, content_type=content_type)
    assert 400 <= response.status_code < 500
    assert "Skyways" in response.content.decode()


def test_bad_method__is_refused_without_a_500(client: Client, unchanged: None) -> None:
    assert client.put(NEW_URL, b"x").status_code == 405
    assert client.delete(NEW_URL).status_code == 405


# --- CSRF ---------------------------------------------------------------------------------------
def test_csrf__missing_token_gets_the_friendly_reload_page(unchanged: None) -> None:
    client = Client(enforce_csrf_checks=True)
    token = fresh_token(client)
    response = client.post(NEW_URL, {**VALID, "submission_token": token})
    assert response.status_code == 403
    assert "Please reload the form" in response.content.decode()


def test_csrf__form_with_its_csrf_token_goes_through() -> None:
    client = Client(enforce_csrf_checks=True)
    page = client.get(NEW_URL).content.decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert csrf
    data = {**VALID, "submission_token": token_in(page), "csrfmiddlewaretoken": csrf.group(1)}
    assert client.post(NEW_URL, data).status_code == 303


# --- submission limits --------------------------------------------------------------------------
@override_settings(REFUNDS_SUBMIT_LIMIT=2)
def test_limit__third_submission_from_one_email_gets_429_with_retry_after(client: Client) -> None:
    create_refund(client, ip="198.51.100.1")
    create_refund(client, ip="198.51.100.2", email=VALID["email"].upper())
    before = counts()
    response = submit(client, fresh_token(client), ip="198.51.100.3")
    assert response.status_code == 429
    assert 3500 <= int(response["Retry-After"]) <= 3600
    assert "Please try again later" in response.content.decode()
    assert counts() == before


@override_settings(REFUNDS_SUBMIT_LIMIT=2)
def test_limit__third_submission_from_one_address_gets_429(client: Client) -> None:
    create_refund(client, email="one@example.com")
    create_refund(client, email="two@example.com")
    response = submit(client, fresh_token(client), email="three@example.com")
    assert response.status_code == 429
    assert int(response["Retry-After"]) > 0
    assert counts() == (2, 2)


@override_settings(REFUNDS_SUBMIT_LIMIT=2)
def test_limit__a_resubmitted_token_is_not_counted_again(client: Client) -> None:
    token = fresh_token(client)
    first = submit(client, token)
    create_refund(client)
    again = submit(client, token)
    assert again.status_code == 303
    assert again["Location"] == first["Location"]


@override_settings(REFUNDS_SUBMIT_LIMIT=2)
def test_limit__submissions_older_than_an_hour_do_not_count(client: Client) -> None:
    create_refund(client)
    create_refund(client)
    RefundRequest.objects.update(created_at=timezone.now() - timedelta(minutes=61))
    assert submit(client, fresh_token(client)).status_code == 303


@override_settings(REFUNDS_SUBMIT_LIMIT=0, REFUNDS_BOOKING_LIMIT=0)
def test_limit__zero_turns_it_off(client: Client) -> None:
    for _ in range(4):
        create_refund(client)
    assert counts() == (4, 4)


@override_settings(REFUNDS_SUBMIT_LIMIT=0, REFUNDS_BOOKING_LIMIT=3)
def test_booking_limit__fourth_request_for_a_booking_in_a_day_gets_429_from_anyone(
    client: Client,
) -> None:
    for n in range(3):
        create_refund(client, ip=f"198.51.100.{n}", email=f"guess{n}@example.com")
    before = counts()
    response = submit(client, fresh_token(client), ip="192.0.2.50", email="owner@example.com")
    assert response.status_code == 429
    assert 86_300 <= int(response["Retry-After"]) <= 86_400
    assert "several requests for this booking today" in response.content.decode()
    assert counts() == before
    assert create_refund(client, ip="192.0.2.50", booking_reference="XYZ789")


# --- the client address behind a reverse proxy ----------------------------------------------
PROXY_ADDR = "10.0.0.2"


def via_proxy(client: Client, forwarded_for: str, **fields: str):
    """A submission that reached us through the proxy, which appended its peer to the header."""
    data = {
        **VALID,
        "message": f"{VALID['message']} (request {next(_requests)})",
        "submission_token": fresh_token(client),
        **fields,
    }
    return client.post(NEW_URL, data, REMOTE_ADDR=PROXY_ADDR, HTTP_X_FORWARDED_FOR=forwarded_for)


@override_settings(REFUNDS_SUBMIT_LIMIT=5, REFUNDS_BOOKING_LIMIT=0, AGENTFLOW_TRUSTED_PROXIES="1")
def test_behind_a_proxy__one_clients_sixth_request_is_refused_anothers_first_accepted(
    client: Client,
) -> None:
    for n in range(5):
        assert via_proxy(client, "198.51.100.7", email=f"c{n}@example.com").status_code == 303
    assert via_proxy(client, "198.51.100.7", email="c5@example.com").status_code == 429
    assert via_proxy(client, "198.51.100.8", email="d0@example.com").status_code == 303
    assert set(RefundRequest.objects.values_list("client_ip", flat=True)) == {
        "198.51.100.7",
        "198.51.100.8",
    }


@override_settings(REFUNDS_SUBMIT_LIMIT=5, REFUNDS_BOOKING_LIMIT=0, AGENTFLOW_TRUSTED_PROXIES="1")
def test_behind_a_proxy__spoofed_extra_hops_do_not_bypass_the_limit(client: Client) -> None:
    for n in range(5):
        spoofed = f"203.0.113.{n}, 192.0.2.{n}, 198.51.100.7"  # the client wrote the first two
        assert via_proxy(client, spoofed, email=f"c{n}@example.com").status_code == 303
    response = via_proxy(client, "203.0.113.99, 198.51.100.7", email="c5@example.com")
    assert response.status_code == 429


@override_settings(REFUNDS_SUBMIT_LIMIT=2, REFUNDS_BOOKING_LIMIT=0, AGENTFLOW_TRUSTED_PROXIES="")
def test_without_trusted_proxies__x_forwarded_for_is_not_believed(client: Client) -> None:
    for n in range(2):
        assert via_proxy(client, f"198.51.100.{n}", email=f"c{n}@example.com").status_code == 303
    assert via_proxy(client, "198.51.100.9", email="c9@example.com").status_code == 429
    assert set(RefundRequest.objects.values_list("client_ip", flat=True)) == {PROXY_ADDR}


@override_settings(REFUNDS_SUBMIT_LIMIT=2, REFUNDS_BOOKING_LIMIT=0)
def test_ipv6_clients__are_counted_per_64(client: Client) -> None:
    create_refund(client, ip="2001:db8:1:2::10", email="one@example.com")
    create_refund(client, ip="2001:db8:1:2:ffff::99", email="two@example.com")
    response = submit(client, fresh_token(client), ip="2001:db8:1:2::abcd", email="3@example.com")
    assert response.status_code == 429
    assert create_refund(client, ip="2001:db8:1:3::10", email="four@example.com")
    assert set(RefundRequest.objects.values_list("client_ip", flat=True)) == {
        "2001:db8:1:2::",
        "2001:db8:1:3::",
    }


# --- status page and JSON -----------------------------------------------------------------------
def test_status_page__new_request_shows_received_and_polls(client: Client) -> None:
    refund = create_refund(client)
    response = client.get(f"/refunds/{refund.public_id}/")
    page = response.content.decode()
    assert response.status_code == 200
    assert "We&#x27;ve received your request" in page
    assert 'aria-live="polite"' in page
    assert f'data-status-url="/refunds/{refund.public_id}/status.json"' in page
    assert '<noscript><meta http-equiv="refresh"' in page
    assert "/static/refunds/status.js" in page
    for label in (
        "Reading your request",
        "Finding your booking",
        "Securing the $45 change fee on your card",
        "Taking the $45 change fee",
    ):
        assert label in page


def test_status_page__final_state_stops_refreshing(client: Client) -> None:
    refund = create_refund(client)
    WorkflowRun.objects.filter(pk=refund.workflow_id).update(status="COMPLETED", wake_at=None)
    page = client.get(f"/refunds/{refund.public_id}/").content.decode()
    assert "All done — your new boarding pass is on its way" in page
    assert 'data-final="true"' in page
    assert 'http-equiv="refresh"' not in page


def test_status_page__shows_no_internal_detail(client: Client) -> None:
    refund = create_refund(client)
    run_id = refund.workflow_id
    add_step(run_id, 1, "load_request", "COMPLETED")
    add_step(run_id, 2, "parse_flight_details", "COMPLETED")
    failed = add_step(
        run_id,
        3,
        "fetch_booking",
        "FAILED",
        attempts=3,
        error='Traceback (most recent call last):\n  File "gateways.py"\nConnectionError: 10.0.0.5',
    )
    WorkflowRun.objects.filter(pk=run_id).update(
        status="WAITING", current_step="fetch_booking", current_seq=3
    )
    page = client.get(f"/refunds/{refund.public_id}/").content.decode()
    assert "This is taking a little longer than usual" in page
    assert "Taking longer than usual, still trying" in page
    for secret in (
        failed.idempotency_key,
        ":key",
        "Traceback",
        "ConnectionError",
        "10.0.0.5",
        "internal-output-value",
        "worker-7",
        run_id,
        "fetch_booking",
        refund.submission_token,
        "203.0.113.7",
    ):
        assert secret not in page, secret


def test_status_json__has_the_specified_shape(client: Client) -> None:
    refund = create_refund(client)
    add_step(refund.workflow_id, 1, "load_request", "COMPLETED")
    add_step(refund.workflow_id, 2, "parse_flight_details", "IN_PROGRESS", attempts=2)
    WorkflowRun.objects.filter(pk=refund.workflow_id).update(
        status="RUNNING", current_step="parse_flight_details", current_seq=2
    )
    response = client.get(f"/refunds/{refund.public_id}/status.json")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    data = response.json()
    assert {"id", "status", "workflow_id", "waiting_for", "steps"} <= set(data)
    assert data["waiting_for"] is None  # "approval" only while a fee waiver waits for our team
    assert data["id"] == refund.public_id
    assert data["status"] == "RUNNING"
    assert data["workflow_id"] == refund.workflow_id
    assert data["steps"] == [
        {"seq": 1, "name": "load_request", "status": "COMPLETED", "attempts": 1},
        {"seq": 2, "name": "parse_flight_details", "status": "IN_PROGRESS", "attempts": 2},
    ]
    customer = data["customer"]
    assert customer["final"] is False
    assert customer["headline"] == "We're working on your request"
    assert [s["state"] for s in customer["steps"][:3]] == ["done", "active", "pending"]
    assert "key" not in response.content.decode()


def test_status_json__new_request_is_pending_with_no_steps(client: Client) -> None:
    refund = create_refund(client)
    data = client.get(f"/refunds/{refund.public_id}/status.json").json()
    assert data["status"] == "PENDING"
    assert data["steps"] == []


def test_status_json__refunded_after_a_failure(client: Client) -> None:
    refund = create_refund(client)
    names = [
        "load_request",
        "parse_flight_details",
        "fetch_booking",
        "check_cancellation_policy",
        "calculate_penalty_fee",
        "charge_customer",
        "cancel_seat",
        "issue_boarding_pass",
        "capture_fee",
    ]
    for seq, name in enumerate(names, start=1):
        add_step(refund.workflow_id, seq, name, "COMPLETED")
    add_step(refund.workflow_id, 10, "update_crm", "FAILED", error="CRM said no")
    add_step(refund.workflow_id, 11, "reinstate_seat", "COMPLETED")
    add_step(refund.workflow_id, 12, "refund_fee", "COMPLETED")
    add_step(refund.workflow_id, 13, "notify_failure", "COMPLETED")
    money = {"payment_intent_id": "pi_1", "amount_cents": 4500, "currency": "usd"}
    for name, output in (
        ("charge_customer", {"authorized": True, **money}),
        ("capture_fee", {"captured": True, **money}),
        ("refund_fee", {"refunded": True, "hold_released": False, "refund_id": "re_1", **money}),
    ):  # what happened to the money is read from the outputs, not from the names
        StepCheckpoint.objects.filter(run_id=refund.workflow_id, name=name).update(output=output)
    WorkflowRun.objects.filter(pk=refund.workflow_id).update(
        status="FAILED", current_step="notify_failure", current_seq=13, wake_at=None
    )
    data = client.get(f"/refunds/{refund.public_id}/status.json").json()
    assert data["status"] == "FAILED"
    customer = data["customer"]
    assert customer["final"] is True
    assert customer["outcome"] == "refunded"
    assert customer["headline"] == "We couldn't complete the change; the $45 fee was refunded"
    assert [s["label"] for s in customer["steps"][-3:]] == [
        "Giving your seat back",
        "Giving back the $45 fee",
        "Letting you know",
    ]


@pytest.mark.parametrize(
    "path",
    [
        "/refunds/rf_doesNotExist000000000/",
        "/refunds/rf_doesNotExist000000000/status.json",
        "/refunds/not-a-refund/",
        "/refunds/rf_" + "x" * 300 + "/",
        "/refunds/rf_%00%ff/",
        "/refunds/%F0%9F%98%80/status.json",
    ],
)
def test_unknown_refund__friendly_404(client: Client, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 404
    page = response.content.decode()
    assert "We can't find that page" in page
    assert "Skyways" in page


def test_refunds_root__redirects_to_the_form(client: Client) -> None:
    response = client.get("/refunds/")
    assert response.status_code == 302
    assert response["Location"] == NEW_URL


# --- admin --------------------------------------------------------------------------------------
@pytest.fixture
def staff_client(client: Client) -> Client:
    user = get_user_model().objects.create_superuser("ops", "ops@example.com", "pw-ops-123")
    client.force_login(user)
    return client


def test_admin__lists_searches_and_links_to_the_run(staff_client: Client) -> None:
    refund = create_refund(staff_client, email="findme@example.com", booking_reference="XYZ789")
    create_refund(staff_client, email="other@example.com")
    base = "/admin/refunds/refundrequest/"
    # The e-mail is sealed in its column: found by the whole address, any case.
    for query in ("FindMe@example.com", "XYZ789", refund.public_id):
        page = staff_client.get(base, {"q": query}).content.decode()
        assert refund.public_id in page, query
        assert "other@example.com" not in page, query
    page = staff_client.get(base).content.decode()
    assert f'href="/admin/agentflow/workflowrun/{quote(refund.workflow_id)}/change/"' in page
    assert "created_at__gte" in page  # the date filter


def test_admin__is_read_only(staff_client: Client) -> None:
    refund = create_refund(staff_client)
    base = "/admin/refunds/refundrequest/"
    page = staff_client.get(f"{base}{refund.pk}/change/")
    assert page.status_code == 200
    assert (
        f"/admin/agentflow/workflowrun/{quote(refund.workflow_id)}/change/" in page.content.decode()
    )
    assert 'name="email"' not in page.content.decode()
    assert staff_client.get(f"{base}add/").status_code == 403
    assert staff_client.post(f"{base}{refund.pk}/change/", {"email": "x@y.z"}).status_code == 403
    assert staff_client.post(f"{base}{refund.pk}/delete/", {"post": "yes"}).status_code == 403
    assert RefundRequest.objects.get().email == VALID["email"]


# --- Content-Security-Policy ----------------------------------------------------------------------
def policy_of(response: Any) -> dict[str, str]:
    header = response.headers.get("Content-Security-Policy", "")
    return dict(part.strip().partition(" ")[::2] for part in header.split(";") if part.strip())


def test_csp__every_customer_page_allows_this_site_s_scripts_and_nothing_inline(
    client: Client,
) -> None:
    refund = create_refund(client)
    for path in (
        "/refunds/new/",
        f"/refunds/{refund.public_id}/",
        f"/refunds/{refund.public_id}/status.json",
        "/refunds/rf_nosuchrefund/",
        "/admin/login/",
    ):
        policy = policy_of(client.get(path))
        assert policy.get("default-src") == "'self'", path
        assert policy.get("script-src") == "'self'", path  # no inline script, no eval
        assert policy.get("object-src") == "'none'" and policy.get("frame-ancestors") == "'none'"


def test_csp__the_admin_s_one_inline_style_block_carries_the_request_s_nonce(
    staff_client: Client,
) -> None:
    response = staff_client.get("/admin/agentflow/workflowrun/")

    [nonce] = re.findall(r'<style nonce="([^"]+)">', response.content.decode())
    assert policy_of(response)["style-src"] == f"'self' 'nonce-{nonce}'"
