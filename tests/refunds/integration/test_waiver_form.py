"""The form's fee waiver (issue 18): a reason from the policy's list plus a few words, each
missing half a field error, nothing typed lost on a bad submit, both kept on the request."""

from __future__ import annotations

import html
import re

import pytest
from django.test import Client

from agentflow.models import WorkflowRun
from refunds import policy
from refunds.models import RefundRequest
from refunds.sandbox.airline import owner_of

pytestmark = pytest.mark.django_db

NEW_URL = "/refunds/new/"
OWNER = owner_of("ABC123")
VALID = {
    "email": OWNER.email,
    "booking_reference": "abc123",
    "last_name": OWNER.last_name,
    "message": "Please move me to SK1240 on 16 March.",
}
DETAILS = "My father was taken to hospital on 2 March; I need to stay with him this week."


def fresh_token(client: Client) -> str:
    page = client.get(NEW_URL).content.decode()
    match = re.search(r'name="submission_token" value="([^"]+)"', page)
    assert match, "the form carries no submission token"
    return html.unescape(match.group(1))


def submit(client: Client, **fields: str):
    data = {**VALID, "submission_token": fresh_token(client), **fields}
    return client.post(NEW_URL, data, REMOTE_ADDR="203.0.113.9")


def counts() -> tuple[int, int]:
    return RefundRequest.objects.count(), WorkflowRun.objects.count()


def test_form__offers_exactly_the_policys_reasons_and_no_waiver_first(client: Client) -> None:
    page = client.get(NEW_URL).content.decode()
    select = re.search(r'<select name="waiver_reason"[^>]*>(.*?)</select>', page, re.S)
    assert select, page
    values = re.findall(r'<option value="([^"]*)"', select.group(1))
    assert values == ["", *policy.WAIVER_REASONS]
    assert '<label class="field__label" for="id_waiver_reason">' in page
    assert '<label class="field__label" for="id_waiver_details">' in page


def test_submit__without_a_waiver_is_a_normal_request(client: Client) -> None:
    response = submit(client)
    assert response.status_code == 303
    refund = RefundRequest.objects.get()
    assert (refund.waiver_reason, refund.waiver_details) == ("", "")


def test_submit__a_waiver_keeps_its_reason_and_words_on_the_request(client: Client) -> None:
    response = submit(client, waiver_reason="medical", waiver_details=f"  {DETAILS}\r\n")
    assert response.status_code == 303
    refund = RefundRequest.objects.get()
    assert refund.waiver_reason == "medical"
    assert refund.waiver_details == DETAILS


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        (
            {"waiver_reason": "medical", "waiver_details": "  "},
            "waiver_details",
            "Tell us briefly what happened, so our team can decide.",
        ),
        (
            {"waiver_reason": "", "waiver_details": DETAILS},
            "waiver_reason",
            "Choose the reason for the waiver, or empty the box below",
        ),
        (
            {"waiver_reason": "bad_weather", "waiver_details": DETAILS},
            "waiver_reason",
            "Choose one of the reasons in the list.",
        ),
        (
            {"waiver_reason": "medical", "waiver_details": "x" * 1001},
            "waiver_details",
            "1,000 characters or fewer (it has 1001)",
        ),
    ],
)
def test_bad_waiver__field_error_linked_to_its_input_and_nothing_lost(
    client: Client, fields: dict[str, str], field: str, words: str
) -> None:
    response = submit(client, **fields)
    page = response.content.decode()
    assert response.status_code == 400
    assert counts() == (0, 0)
    assert html.escape(words) in page
    assert f'id="id_{field}_error"' in page
    assert f'href="#id_{field}"' in page  # the error summary links to the field
    widget = re.search(rf"<(?:select|textarea)[^>]*id=\"id_{field}\"[^>]*>", page)
    assert widget, page
    assert 'aria-invalid="true"' in widget.group(0)
    # Everything typed is still there: the other fields, the details and the choice.
    assert f'value="{VALID["email"]}"' in page
    assert VALID["message"] in page
    if fields["waiver_details"].strip() and len(fields["waiver_details"]) < 1001:
        assert html.escape(DETAILS) in page
    if fields["waiver_reason"] in policy.WAIVER_REASONS:
        assert f'<option value="{fields["waiver_reason"]}" selected>' in page


def test_resubmitted_words__with_a_waiver_added_are_a_new_request(client: Client) -> None:
    first = submit(client)
    second = submit(client, waiver_reason="bereavement", waiver_details=DETAILS)
    assert first["Location"] != second["Location"]
    assert counts() == (2, 2)


def test_status_page__shows_the_waiver_asked_for_beside_the_message(client: Client) -> None:
    response = submit(client, waiver_reason="medical", waiver_details=DETAILS)
    page = client.get(response["Location"]).content.decode()
    assert "You asked us to waive the change fee:" in page
    assert html.escape(policy.WAIVER_REASONS["medical"]) in page
    assert html.escape(DETAILS) in page
    plain = client.get(submit(client)["Location"]).content.decode()
    assert "waive the change fee:" not in plain
