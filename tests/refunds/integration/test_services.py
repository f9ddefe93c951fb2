"""The refund write paths on real Postgres: one request per token, even under a race; limits."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings
from django.utils import timezone

from agentflow.models import WorkflowRun
from agentflow.testing.waiting import wait_for
from refunds import services
from refunds.models import RefundRequest


def create(token: str = "t" * 32, **overrides: str | None) -> RefundRequest:
    fields: dict = {
        "email": "ana@example.com",
        "booking_reference": "ABC123",
        "last_name": "Eriksen",
        "message": f"Move me to Friday. ({token[:8]})",  # distinct words: a distinct request
        "submission_token": token,
        "client_ip": "203.0.113.9",
        **overrides,
    }
    return services.refund_request_create(**fields)


@pytest.mark.django_db
def test_create__starts_the_refund_run_and_enqueues_it_on_commit(
    django_capture_on_commit_callbacks,
) -> None:
    with django_capture_on_commit_callbacks() as callbacks:
        refund = create()
    run = WorkflowRun.objects.get()
    assert refund.workflow_id == run.id
    assert run.workflow == "refund"
    assert run.business_key == refund.public_id
    assert run.input == {"refund_id": refund.public_id, "customer": refund.email.lower()}
    # The first step's message, published only after commit (beside the metrics' callbacks).
    assert len([c for c in callbacks if c.__qualname__.startswith("send_step")]) == 1
    assert refund.public_id.startswith("rf_") and len(refund.public_id) >= 22


@pytest.mark.django_db
def test_create__same_token_returns_the_same_request_and_starts_nothing_new() -> None:
    first = create()
    second = create(booking_reference="ZZZ999", message="Different words")
    assert second.pk == first.pk
    assert second.booking_reference == "ABC123"
    assert (RefundRequest.objects.count(), WorkflowRun.objects.count()) == (1, 1)


@pytest.mark.django_db(transaction=True)
def test_create__concurrent_same_token_loses_race_on_unique_constraint_to_one_request() -> None:
    """The first writer holds its insert uncommitted; the second passes the "seen before?"
    check, blocks on the unique index, gets IntegrityError when the first commits, and returns
    the first's request. Its own run rolls back with it."""
    inserted = threading.Event()
    release = threading.Event()
    results: dict[str, RefundRequest | BaseException] = {}

    def first_writer() -> None:
        try:
            with transaction.atomic():
                results["first"] = create()
                inserted.set()
                release.wait(timeout=30)
        except BaseException as exc:  # surfaced by the asserts below
            results["first"] = exc
            inserted.set()
        finally:
            connections.close_all()

    def second_writer() -> None:
        try:
            results["second"] = create(message="typed again")
        except BaseException as exc:
            results["second"] = exc
        finally:
            connections.close_all()

    one = threading.Thread(target=first_writer)
    one.start()
    assert inserted.wait(timeout=30)
    two = threading.Thread(target=second_writer)
    two.start()
    try:
        wait_for(_someone_waits_on_a_lock, timeout=30, what="second insert blocked on the index")
    finally:
        release.set()
        one.join(timeout=30)
        two.join(timeout=30)
    first, second = results["first"], results["second"]
    assert isinstance(first, RefundRequest), first
    assert isinstance(second, RefundRequest), second
    assert second.pk == first.pk
    assert (RefundRequest.objects.count(), WorkflowRun.objects.count()) == (1, 1)
    assert WorkflowRun.objects.get().id == first.workflow_id


def _someone_waits_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0


# --- limits -------------------------------------------------------------------------------------
def allowed(
    email: str, client_ip: str | None, *, booking_reference: str = "ABC123", last_name: str = "Eve"
) -> tuple[bool, int]:
    """Whether a stranger's request (not the booking's owner: the name is wrong) fits now."""
    refused = services.refusal(
        email=email, booking_reference=booking_reference, last_name=last_name, client_ip=client_ip
    )
    return (True, 0) if refused is None else (False, refused.retry_after)


def booking_allowed(reference: str) -> tuple[bool, int]:
    return allowed("someone@example.com", None, booking_reference=reference)


@pytest.mark.django_db
@override_settings(REFUNDS_SUBMIT_LIMIT=2)
def test_allowed__under_the_limit() -> None:
    create("a" * 32)
    assert allowed("ana@example.com", "203.0.113.9") == (True, 0)


@pytest.mark.django_db
@override_settings(REFUNDS_SUBMIT_LIMIT=2)
def test_allowed__email_at_the_limit_waits_until_the_oldest_counted_one_ages_out() -> None:
    create("a" * 32, client_ip="198.51.100.1")
    create("b" * 32, client_ip="198.51.100.2")
    RefundRequest.objects.filter(submission_token="a" * 32).update(
        created_at=timezone.now() - timedelta(minutes=20)
    )
    RefundRequest.objects.filter(submission_token="b" * 32).update(
        created_at=timezone.now() - timedelta(minutes=50)
    )
    ok, retry_after = allowed("ANA@Example.com", "192.0.2.1")
    assert not ok
    # A slot frees when the older one (50 minutes old) leaves the hour.
    assert 10 * 60 - 5 <= retry_after <= 10 * 60 + 1


@pytest.mark.django_db
@override_settings(REFUNDS_SUBMIT_LIMIT=2)
def test_allowed__address_at_the_limit_is_refused_for_any_email() -> None:
    create("a" * 32, email="one@example.com")
    create("b" * 32, email="two@example.com")
    ok, retry_after = allowed("three@example.com", "203.0.113.9")
    assert not ok
    assert 3590 <= retry_after <= 3600


@pytest.mark.django_db
@override_settings(REFUNDS_SUBMIT_LIMIT=2)
def test_allowed__no_address_counts_only_the_email() -> None:
    create("a" * 32, email="one@example.com", client_ip=None)
    create("b" * 32, email="two@example.com", client_ip=None)
    assert allowed("three@example.com", None) == (True, 0)


@pytest.mark.django_db
@override_settings(REFUNDS_SUBMIT_LIMIT=0, REFUNDS_BOOKING_LIMIT=0)
def test_allowed__zero_turns_the_limit_off() -> None:
    for n in range(3):
        create(str(n) * 32)
    assert allowed("ana@example.com", "203.0.113.9") == (True, 0)


@pytest.mark.django_db
@override_settings(REFUNDS_SUBMIT_LIMIT=0, REFUNDS_BOOKING_LIMIT=3)
def test_allowed__fourth_strangers_request_for_one_booking_in_a_day_waits() -> None:
    for n, when in enumerate((23, 5, 1)):
        create(str(n) * 32, email=f"{n}@example.com", client_ip=f"198.51.100.{n}")
        RefundRequest.objects.filter(submission_token=str(n) * 32).update(
            created_at=timezone.now() - timedelta(hours=when)
        )
    ok, retry_after = booking_allowed("ABC123")
    assert not ok
    # A slot frees when the oldest (23 hours old) leaves the day.
    assert 3600 - 5 <= retry_after <= 3600 + 1
    assert booking_allowed("XYZ789") == (True, 0)


@pytest.mark.django_db
@override_settings(REFUNDS_SUBMIT_LIMIT=0, REFUNDS_BOOKING_LIMIT=3)
def test_allowed__booking_requests_older_than_a_day_do_not_count() -> None:
    for n in range(3):
        create(str(n) * 32, email=f"{n}@example.com")
    RefundRequest.objects.update(created_at=timezone.now() - timedelta(hours=24, minutes=1))
    assert booking_allowed("ABC123") == (True, 0)


@pytest.mark.django_db
@override_settings(REFUNDS_SUBMIT_LIMIT=0, REFUNDS_BOOKING_LIMIT=0)
def test_allowed__booking_limit_zero_turns_it_off() -> None:
    for n in range(5):
        create(str(n) * 32, email=f"{n}@example.com")
    assert booking_allowed("ABC123") == (True, 0)


@pytest.mark.django_db
def test_refund_request_create__same_words_with_a_fresh_token_is_the_same_refund() -> None:
    """A browser without a back/forward cache re-fetches the form (new token) on Back."""
    words = {
        "email": "Back@Example.com",
        "booking_reference": "BCK123",
        "last_name": "Berg",
        "message": "Move me",
    }
    first = services.refund_request_create(**words, submission_token="t-one", client_ip=None)
    again = services.refund_request_create(
        **{**words, "email": "back@example.com"}, submission_token="t-two", client_ip=None
    )
    assert again.pk == first.pk
    assert RefundRequest.objects.count() == 1


@pytest.mark.django_db
def test_refund_request_create__a_corrected_last_name_is_a_new_request() -> None:
    """After "These details don't match a booking", fixing the name must try again."""
    words = {"email": "fix@example.com", "booking_reference": "FIX123", "message": "Move me"}
    wrong = services.refund_request_create(
        **words, last_name="Bergg", submission_token="t-one", client_ip=None
    )
    fixed = services.refund_request_create(
        **words, last_name="Berg", submission_token="t-two", client_ip=None
    )
    assert fixed.pk != wrong.pk
    assert fixed.last_name == "Berg"
