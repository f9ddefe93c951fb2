"""The customer's pages while the database does not answer (issue 37): the form answers 503 with
`Retry-After` and keeps what they typed, token and all, so sending it again once the database is
back makes exactly one refund; the status page and its JSON answer 503; no page writes an ERROR
line of its own (the process tells the outage once).

The database is really unreachable: this process's connections go to a port where nothing
listens (tests/support/outage.py), then back to the real Postgres.
"""

from __future__ import annotations

import html
import logging

import pytest
from django.test import Client

from agentflow._core import outage
from refunds.models import RefundRequest
from refunds.privacy import email_digest
from tests.refunds.integration.test_pages import NEW_URL, VALID, fresh_token, submit, token_in
from tests.support.outage import database_down

pytestmark = pytest.mark.django_db(transaction=True)


def _errors(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.name, r.getMessage()) for r in caplog.records if r.levelno >= logging.ERROR]


def test_form__503_with_retry_after_keeps_what_was_typed_and_its_token(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    token = fresh_token(client)  # the form was open before the database went
    message = "Please move me to the 18:05 to Oslo on 14 March. Isn't that possible?"

    with database_down():
        answers = [submit(client, token, message=message) for _ in range(3)]

    for response in answers:
        assert response.status_code == 503
        assert response["Retry-After"] == str(outage.RETRY_AFTER_SECONDS)
        page = response.content.decode()
        assert "We couldn't take your request just now" in page
        assert html.escape(message) in page
        assert f'value="{VALID["email"]}"' in page
        assert token_in(page) == token  # the same one-time token: never a second request
    assert [name for name, _ in _errors(caplog)] == ["agentflow.outage"]


def test_form__sent_again_once_the_database_is_back_makes_one_refund(client: Client) -> None:
    token = fresh_token(client)
    with database_down():
        kept = token_in(submit(client, token).content.decode())

    first = submit(client, kept)
    again = submit(client, kept)  # the customer clicks twice, or had sent it before

    assert first.status_code == again.status_code == 303
    assert first["Location"] == again["Location"]
    assert RefundRequest.objects.filter(email_digest=email_digest(VALID["email"])).count() == 1


def test_form__a_new_visit_still_gets_a_form_to_fill_in(client: Client) -> None:
    """The form page itself needs no database: a customer can type while it is down."""
    with database_down():
        page = client.get(NEW_URL)

    assert page.status_code == 200
    assert token_in(page.content.decode())


@pytest.mark.parametrize(
    ("accept", "kind"),
    [("text/html", "text/html"), ("application/json", "application/json")],
    ids=["status-page", "status-json"],
)
def test_status_page__503_the_site_s_page_or_json(
    client: Client, caplog: pytest.LogCaptureFixture, accept: str, kind: str
) -> None:
    location = submit(client, fresh_token(client))["Location"]
    path = location if kind == "text/html" else f"{location}status.json"

    with database_down():
        response = client.get(path, headers={"Accept": accept})

    assert response.status_code == 503
    assert response["Retry-After"] == str(outage.RETRY_AFTER_SECONDS)
    assert response["Content-Type"].startswith(kind)
    if kind == "text/html":
        assert "We'll be back in a minute" in response.content.decode()
        assert "If you had just sent the form" not in response.content.decode()
    else:
        assert response.json() == {"error": "unavailable", "retry_after": 30}
    assert [name for name, _ in _errors(caplog)] == ["agentflow.outage"]
