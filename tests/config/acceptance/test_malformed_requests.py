"""What anyone can send this site's unauthenticated pages, through gunicorn as deployed: raw
requests with a Host it does not serve, bodies too big or too many fields, bodies and headers it
cannot read. Each is answered 4xx, and the web log has one WARNING line for it and no
traceback (Django logs most of these at ERROR with one); what is not HTTP at all, gunicorn
refuses with a 400 and no line."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import EnvBuilder
from tests.support.stack import WebProcess

pytestmark = pytest.mark.django_db(transaction=True)

FORM = b"application/x-www-form-urlencoded"


@pytest.fixture
def web(worker_env: EnvBuilder, tmp_path: Path) -> Iterator[WebProcess]:
    web = WebProcess(worker_env(AGENTFLOW_METRICS_TOKEN="t"), tmp_path / "web.log", workers=1)
    web.start()
    try:
        yield web
    finally:
        web.stop()


def raw(web: WebProcess, head: bytes, body: bytes = b"") -> int:
    """Send one request exactly as written (`head`: its request line and headers) and return
    the status gunicorn answers."""
    with socket.create_connection(("127.0.0.1", web.port), timeout=30) as conn:
        conn.sendall(head.replace(b"\n", b"\r\n") + b"\r\n" + body)
        conn.shutdown(socket.SHUT_WR)
        answer = b""
        while b"\r\n" not in answer:
            chunk = conn.recv(4096)
            if not chunk:
                break
            answer += chunk
    return int(answer.split(b" ", 2)[1])


Request = tuple[bytes, bytes]


def post(
    path: bytes, body: bytes, content_type: bytes = FORM, length: int | None = None
) -> Request:
    """`length`: the Content-Length it declares, if not the body's (a body too big to send
    whole: the server answers and closes before reading it, and the rest would be lost)."""
    head = b"POST %s HTTP/1.1\nHost: 127.0.0.1\nContent-Type: %s\nContent-Length: %d\n" % (
        path,
        content_type,
        len(body) if length is None else length,
    )
    return head + b"Connection: close\n", body


def get(path: bytes, *headers: bytes, host: bytes = b"127.0.0.1") -> Request:
    head = b"GET %s HTTP/1.1\nHost: %s\n" % (path, host)
    return head + b"".join(h + b"\n" for h in headers) + b"Connection: close\n", b""


REQUESTS: dict[str, Request] = {
    "a Host not allowed": get(b"/refunds/new/", host=b"evil.example"),
    "a Host not allowed, at the health check": get(b"/healthz", host=b"evil.example"),
    "a Host that is no name": get(b"/admin/login/", host=b"\xff\xfe"),
    "a form over the size limit": post(b"/refunds/new/", b"m=xxxx", length=3_000_000),
    "an admin login over the size limit": post(b"/admin/login/", b"u=xxxx", length=3_000_000),
    "too many fields": post(b"/refunds/new/", b"&".join(b"f%d=1" % i for i in range(1500))),
    "multipart without a boundary": post(b"/admin/login/", b"x", b"multipart/form-data"),
    "a form in UTF-16": post(b"/refunds/new/", b"a=b", FORM + b"; charset=utf-16"),
    "a Content-Type parameter in an unknown encoding": post(
        b"/refunds/new/", b"a=b", FORM + b"; charset*=nope''x"
    ),
    "a metrics token of odd bytes": get(b"/metrics", b"Authorization: Bearer \xff\xfe\xe9"),
    "metrics without its token": get(b"/metrics"),
    "a status page that does not exist": get(b"/refunds/rf_" + b"a" * 22 + b"/"),
    "its JSON": get(b"/refunds/rf_" + b"a" * 22 + b"/status.json"),
    "a status page id with NUL and bytes that are not UTF-8": get(b"/refunds/rf_%00%ff/"),
    "the health check, posted to": post(b"/healthz", b"a=b"),
    "a form with NUL in every field": post(
        b"/refunds/new/", b"email=%00&last_name=%00&message=%00&submission_token=%00"
    ),
}


#: What is not HTTP at all: gunicorn answers 400 before Django sees it, and logs nothing.
NOT_HTTP: dict[str, Request] = {
    "a Content-Length that is no number": (
        b"POST /refunds/new/ HTTP/1.1\nHost: 127.0.0.1\nContent-Length: \xc2\xb2\n",
        b"a=b",
    ),
    "a Content-Length of 5000 digits": (
        b"POST /refunds/new/ HTTP/1.1\nHost: 127.0.0.1\nContent-Length: %s\n" % (b"9" * 5000),
        b"a=b",
    ),
    "a control character in a header": get(b"/metrics", b"Authorization: Bearer \x01"),
}


def warnings_and_worse(log: str) -> list[dict[str, object]]:
    """The web log's JSON lines at WARNING and above (gunicorn's own lines are not JSON)."""
    lines = []
    for text in log.splitlines():
        if not text.startswith("{"):
            continue
        line = json.loads(text)
        if line["level"] in ("warning", "error", "critical"):
            lines.append(line)
    return lines


def test_malformed_requests__each_4xx_with_one_warning_line_and_no_traceback(
    web: WebProcess,
) -> None:
    problems = {}
    for what, (head, body) in REQUESTS.items():
        before = len(web.log())
        status = raw(web, head, body)
        written = web.log()[before:]  # the worker logs before it answers
        found = warnings_and_worse(written)
        if (
            not 400 <= status < 500
            or "Traceback" in written
            or "[ERROR]" in written
            or [(line["level"], "exception" in line) for line in found] != [("warning", False)]
        ):
            problems[what] = (status, written[-2000:])
    for what, (head, body) in NOT_HTTP.items():
        before = len(web.log())
        status = raw(web, head, body)
        written = web.log()[before:]
        if status != 400 or "Traceback" in written or warnings_and_worse(written):
            problems[what] = (status, written[-2000:])

    assert problems == {}
