"""Many people's requests saved at once (a cancelled flight's, refunds.flights): each sealed
under its own person's key, the keys read or made together (`durable.personal_keys`), so a
thousand rows cost a few statements, not one key lookup per field and row. Real Postgres."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from agentflow import durable
from agentflow._privacy import keystore
from agentflow.models import SubjectKey
from refunds.models import RefundRequest

pytestmark = pytest.mark.django_db(transaction=True)


def request(i: int) -> RefundRequest:
    return RefundRequest(
        public_id=f"rf_bulk{i:04d}",
        email=f"Bulk.Passenger{i}@Example.org",
        booking_reference=f"B{i:05d}",
        last_name=f"Lastname{i}",
        message="My flight was cancelled by the airline.",
        submission_token=f"bulk:{i}",
    )


def test_personal_keys__a_thousand_requests_sealed_per_person_in_a_few_statements() -> None:
    assert keystore.enabled()
    people = [request(i) for i in range(1000)]
    with (
        CaptureQueriesContext(connection) as queries,
        transaction.atomic(),
        durable.personal_keys(r.email for r in people),
    ):
        RefundRequest.objects.bulk_create(people, batch_size=1000)
    statements = [
        q for q in queries.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))
    ]
    # BEGIN; the hmac key (read, made: the first key here, read back); the keys (read, one
    # INSERT, read back); the requests' INSERT: the same for 10 rows or 1,000.
    assert len(statements) <= 10, [q["sql"][:80] for q in statements]
    print(f"\n1,000 requests of 1,000 new people: {len(statements)} statements")

    with connection.cursor() as cursor:
        cursor.execute("SELECT email, last_name FROM refunds_refundrequest")
        stored = cursor.fetchall()
    assert len(stored) == 1000
    assert not any("Passenger" in email or "Lastname" in name for email, name in stored)
    assert SubjectKey.objects.exclude(id=keystore.HMAC_ROW).count() == 1000  # one per person
    keystore.forget_cached()
    found = RefundRequest.objects.get(public_id="rf_bulk0007")
    assert (found.email, found.last_name) == ("Bulk.Passenger7@Example.org", "Lastname7")
