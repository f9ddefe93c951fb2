"""The signed-webhook view under whatever anyone on the internet sends it, through Django's test
client against real Postgres: every malformed request is answered 4xx with one WARNING line
(the view's own, with its reason) and no traceback, and nothing is delivered unless the request
is signed. Each finding of the outside probe has its own test; a Hypothesis fuzz covers the rest.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

import pytest
import stripe
from django.test import Client
from hypothesis import given
from hypothesis import strategies as st

from agentflow import durable, webhooks
from agentflow._core.serialization import MAX_DEPTH
from agentflow.models import RunSignal, WebhookReceipt
from agentflow.testing import run_to_end
from tests.support import workflows
from tests.support.malformed import BUDGET, Lines, logged

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]

SECRET = "whsec_airline_test"
URL = "/hooks/airline/"


@pytest.fixture
def hooks(settings: Any) -> Client:
    """This site with the view mounted and the airline's secret set."""
    settings.ROOT_URLCONF = "tests.support.webhook_urls"
    settings.AGENTFLOW_WEBHOOK_SECRETS = {"airline": SECRET}
    return Client()


@pytest.fixture
def run_id() -> str:
    """A run waiting for the signal "reply"."""
    run_id = durable.start(workflows.signalled.name)
    assert run_to_end(run_id, retries=False).waiting_for == "signal"
    return run_id


def send(
    client: Client,
    body: bytes,
    header: str | None,
    *,
    content_type: str = "application/json",
    **meta: str,
) -> Any:
    """POST `body` as it is (no re-encoding by the test client), with `header` as the
    signature and `meta` as further WSGI variables (e.g. CONTENT_LENGTH)."""
    headers = {webhooks.SIGNATURE_HEADER: header} if header is not None else {}
    return client.generic("POST", URL, body, content_type=content_type, headers=headers, **meta)


def signed(body: bytes, *, at: int | None = None) -> str:
    return webhooks.sign(SECRET, body, timestamp=int(time.time()) if at is None else at)


def message(run_id: str, event: str = "evt_1", **extra: Any) -> bytes:
    return json.dumps({"id": event, "run_id": run_id, "signal": "reply", **extra}).encode()


def assert_refused_in_one_line(answered: Any, lines: Lines, status: int, says: str) -> None:
    """`status` with the reason, and the view's one WARNING line: no traceback, no second
    line from Django's request logger, no ERROR."""
    assert answered.status_code == status, answered.content[:300]
    assert answered.json()["error"].startswith(says), answered.json()
    [line] = lines.records
    assert (line.name, line.levelno, line.exc_info) == ("agentflow.webhooks", logging.WARNING, None)
    assert says in line.getMessage() and len(line.getMessage()) < 300


def nothing_delivered() -> bool:
    return not RunSignal.objects.exists() and not WebhookReceipt.objects.exists()


# --- the probe's findings, one by one -----------------------------------------------------------
@pytest.mark.parametrize(
    "timestamp",
    ["\u00b2", "\u0663", "\uff11\uff17", "1" * 900, "-5", "1.5", " 17", "0x10"],
    ids=[
        "superscript",
        "arabic-indic",
        "fullwidth",
        "900-digits",
        "negative",
        "fraction",
        "space",
        "hex",
    ],
)
def test_a_timestamp_not_of_ascii_digits__400_in_one_line(
    hooks: Client, run_id: str, timestamp: str
) -> None:
    body = message(run_id)
    header = f"t={timestamp},v1={signed(body).split('v1=')[1]}"

    with logged() as lines:
        answered = send(hooks, body, header)

    assert_refused_in_one_line(answered, lines, 400, f"no {webhooks.SIGNATURE_HEADER} header")
    assert nothing_delivered()


@pytest.mark.parametrize(
    "signature",
    ["\u00e9" * 64, "\u0663" * 64, "A" * 64, "0" * 63, "0" * 65, ""],
    ids=["accented", "arabic-indic", "upper-case", "short", "long", "empty"],
)
def test_a_signature_not_of_lowercase_hex__400_in_one_line(
    hooks: Client, run_id: str, signature: str
) -> None:
    with logged() as lines:
        answered = send(hooks, message(run_id), f"t={int(time.time())},v1={signature}")

    assert_refused_in_one_line(answered, lines, 400, f"no {webhooks.SIGNATURE_HEADER} header")
    assert nothing_delivered()


def test_a_header_of_thousands_of_characters__400_in_one_line(hooks: Client, run_id: str) -> None:
    body = message(run_id)
    header = signed(body) + ",v1=" + "0" * 64 * 100

    with logged() as lines:
        answered = send(hooks, body, header)

    assert_refused_in_one_line(answered, lines, 400, f"the {webhooks.SIGNATURE_HEADER} header is")
    assert nothing_delivered()


def test_fifty_malformed_headers__fifty_short_warning_lines(hooks: Client, run_id: str) -> None:
    """The probe's 50 requests wrote 92 KB of ERROR tracebacks in a second."""
    with logged() as lines:
        answers = [send(hooks, message(run_id), f"t={'9' * 5000},v1=ab") for _ in range(50)]

    assert {a.status_code for a in answers} == {400}
    assert len(lines.records) == 50
    assert all(r.levelno == logging.WARNING and not r.exc_info for r in lines.records)
    assert sum(len(r.getMessage()) for r in lines.records) < 50 * 200


def test_a_body_over_the_limit__413_in_one_line__signed_or_not(
    hooks: Client, run_id: str, settings: Any
) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    body = message(run_id, payload="x" * 20_000)

    for header in (signed(body), "t=1,v1=" + "0" * 64):
        with logged() as lines:
            answered = send(hooks, body, header)
        assert_refused_in_one_line(answered, lines, 413, "the body is larger than")
    assert nothing_delivered()


@pytest.mark.parametrize("length", ["abc", "²", "9" * 5000, "-5", "1e3"])
def test_a_content_length_that_is_no_number__400_in_one_line(
    hooks: Client, run_id: str, length: str
) -> None:
    body = message(run_id)

    with logged() as lines:
        answered = send(hooks, body, signed(body), CONTENT_LENGTH=length)

    assert_refused_in_one_line(answered, lines, 400, "the Content-Length header")
    assert nothing_delivered()


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json; charset=latin-1",
        "application/jsonp",
        "",
        "\x00\xff",
    ],
    ids=["text", "form", "multipart", "latin-1", "jsonp", "none", "garbage"],
)
def test_a_body_sent_as_another_content_type__415_in_one_line(
    hooks: Client, run_id: str, content_type: str
) -> None:
    body = message(run_id)

    with logged() as lines:
        answered = send(hooks, body, signed(body), content_type=content_type)

    assert_refused_in_one_line(answered, lines, 415, "the body is sent as application/json")
    assert nothing_delivered()


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "application/json; charset=utf-8", "Application/JSON; charset=UTF-8"],
)
def test_json_as_partners_send_it__delivered(hooks: Client, run_id: str, content_type: str) -> None:
    body = message(run_id)

    answered = send(hooks, body, signed(body), content_type=content_type)

    assert answered.status_code == 200, answered.content


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"payload": "a\x00b"}, "the payload of signal 'reply' holds a NUL character"),
        ({"payload": {"key\x00": 1}}, "the payload of signal 'reply' holds a NUL character"),
        ({"payload": "\ud800"}, "the payload of signal 'reply' holds a NUL character"),
        ({"signal": "re\x00ply"}, "a signal needs a name"),
        ({"id": "evt\x00"}, "a signal needs a signal_id"),
        ({"run_id": "wf_\x00"}, "a run id is text without NUL"),
    ],
    ids=["nul-payload", "nul-key", "lone-surrogate", "nul-name", "nul-id", "nul-run-id"],
)
def test_a_signed_body_postgres_cannot_store__400_in_one_line(
    hooks: Client, run_id: str, extra: dict[str, Any], says: str
) -> None:
    body = json.dumps({"id": "evt_1", "run_id": run_id, "signal": "reply", **extra}).encode()

    with logged() as lines:
        answered = send(hooks, body, signed(body))

    assert_refused_in_one_line(answered, lines, 400, says)
    assert nothing_delivered()
    assert durable.snapshot(run_id).waiting_for == "signal"  # type: ignore[union-attr]


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 990, 5_000, 100_000])
def test_a_signed_body_nested_very_deep__400_in_one_line(
    hooks: Client, run_id: str, depth: int
) -> None:
    body = b'{"id": "evt_1", "run_id": "%s", "signal": "reply", "payload": %s}' % (
        run_id.encode(),
        b"[" * depth + b"]" * depth,
    )

    with logged() as lines:
        answered = send(hooks, body, signed(body))

    assert answered.status_code == 400, answered.content[:300]
    assert f"nested deeper than {MAX_DEPTH} levels" in answered.json()["error"]
    assert_refused_in_one_line(answered, lines, 400, answered.json()["error"])
    assert nothing_delivered()


@pytest.mark.parametrize(
    "body",
    [
        b'{"id": "\xff", "run_id": "wf_x", "signal": "reply"}',
        b'{"payload": ' + b"1" * 5000 + b"}",
        b'{"id": "e", "run_id": "wf_x", "signal": "reply", "payload": NaN}',
        b"\xef\xbb\xbf{}",
    ],
    ids=["not-utf-8", "5000-digit-number", "nan", "bom"],
)
def test_a_signed_body_that_is_no_json_we_keep__400_in_one_line(hooks: Client, body: bytes) -> None:
    with logged() as lines:
        answered = send(hooks, body, signed(body))

    assert answered.status_code == 400, answered.content[:300]
    assert_refused_in_one_line(answered, lines, 400, answered.json()["error"])
    assert nothing_delivered()


def test_a_payload_at_the_depth_limit__delivered_as_sent(hooks: Client, run_id: str) -> None:
    payload = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    body = b'{"id": "evt_1", "run_id": "%s", "signal": "reply", "payload": %s}' % (
        run_id.encode(),
        payload.encode(),
    )

    answered = send(hooks, body, signed(body))

    assert answered.status_code == 200, answered.content[:300]
    [kept] = RunSignal.objects.filter(run_id=run_id)
    assert json.dumps(kept.payload, separators=(",", ":")) == payload


# --- Stripe's scheme, both ways -----------------------------------------------------------------
def test_stripes_own_signer_and_verifier_agree_with_ours(hooks: Client, run_id: str) -> None:
    body = message(run_id)
    theirs = stripe.WebhookSignature.generate_signature_header(body.decode(), SECRET)
    ours = signed(body)

    answered = send(hooks, body, theirs)

    assert answered.status_code == 200, answered.content
    assert stripe.WebhookSignature.verify_header(body, ours, SECRET, tolerance=300)
    assert stripe.WebhookSignature.verify_header(body, theirs, SECRET, tolerance=300)


# --- the fuzz -----------------------------------------------------------------------------------
#: What a timestamp or a signature might look like to someone guessing: digits of every kind,
#: hex of the wrong case or length, and whatever else.
_DIGITS = "0123456789\u00b2\u00b3\u00b9\u0660\u0661\u0663\uff10\uff11\uff19"
_text = st.text(max_size=80)
_timestamps = st.one_of(
    st.text(alphabet=_DIGITS, min_size=0, max_size=30), st.just("9" * 5000), _text
)
_signatures = st.one_of(st.text(alphabet="0123456789abcdefABCDEF", max_size=70), _text)
_headers = st.one_of(
    st.none(),
    _text,
    st.builds(lambda t, v: f"t={t},v1={v}", _timestamps, _signatures),
    st.builds(
        lambda t, v, n: f"t={t}," + f"v1={v}," * n, _timestamps, _signatures, st.integers(1, 400)
    ),
)
_content_types = st.one_of(
    st.sampled_from(
        [
            "application/json",
            "application/json; charset=utf-8",
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=b",
            "application/json; charset=utf-16",
            "",
        ]
    ),
    # Not RFC 2231 parameters (`x*=enc''v`): Django raises while building the request, before
    # any view; the site refuses those in front of Django (config.wsgi, its own test).
    _text.filter(lambda text: "*" not in text),
)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@st.composite
def _payload_bodies(draw: Any, run_id: str) -> bytes:
    """A body naming the waiting run, whose payload or fields are whatever JSON (NUL, lone
    surrogates, NaN, deep nesting included), or bytes that are no JSON at all."""
    kind = draw(st.sampled_from(["payload", "fields", "deep", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "deep":
        depth = draw(st.integers(MAX_DEPTH - 2, 3000))
        bracket = draw(st.sampled_from(["[]", "{}"]))
        opened = '{"k": ' * depth if bracket == "{}" else "[" * depth
        closed = "}" * depth if bracket == "{}" else "]" * depth
        return b'{"id": "e", "run_id": "%s", "signal": "reply", "payload": %s}' % (
            run_id.encode(),
            (opened + "1" + closed if bracket == "{}" else opened + closed).encode(),
        )
    fields: dict[str, Any] = {"id": "evt", "run_id": run_id, "signal": "reply"}
    if kind == "fields":
        fields.update(draw(st.dictionaries(st.sampled_from(["id", "run_id", "signal"]), _json)))
    fields["payload"] = draw(_json)
    return json.dumps(fields, allow_nan=True).encode("utf-8", "surrogatepass")


def test_fuzz__unsigned_requests__4xx_one_warning_line_nothing_delivered(
    hooks: Client, run_id: str
) -> None:
    @BUDGET
    @given(
        body=st.one_of(st.binary(max_size=300), _payload_bodies(run_id)),
        header=_headers,
        content_type=_content_types,
        # Never a number of bytes: the test client cannot send fewer than it says.
        length=st.one_of(st.none(), _text.filter(lambda text: not re.fullmatch("[0-9]+", text))),
    )
    def unsigned(body: bytes, header: str | None, content_type: str, length: str | None) -> None:
        meta = {"CONTENT_LENGTH": length} if length is not None else {}
        with logged() as lines:
            answered = send(hooks, body, header, content_type=content_type, **meta)

        assert 400 <= answered.status_code < 500, answered.content[:300]
        assert [(r.name, r.levelno, r.exc_info) for r in lines.records] == [
            ("agentflow.webhooks", logging.WARNING, None)
        ]
        assert nothing_delivered()

    unsigned()


def test_fuzz__signed_malformed_payloads__never_5xx_nor_a_traceback(
    hooks: Client, run_id: str
) -> None:
    @BUDGET
    @given(body=_payload_bodies(run_id), content_type=_content_types)
    def signed_malformed(body: bytes, content_type: str) -> None:
        RunSignal.objects.all().delete()
        WebhookReceipt.objects.all().delete()
        with logged() as lines:
            answered = send(hooks, body, signed(body), content_type=content_type)

        assert answered.status_code in (200, 400, 409, 415), answered.content[:300]
        assert all(r.levelno == logging.WARNING and not r.exc_info for r in lines.records)
        if answered.status_code == 200:
            assert lines.records == []
            [kept] = RunSignal.objects.all()
            assert kept.payload == json.loads(body)["payload"]
        else:
            assert [r.name for r in lines.records] == ["agentflow.webhooks"]
            assert nothing_delivered()

    signed_malformed()
