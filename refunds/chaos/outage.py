"""A database outage in a chaos run (`--postgres-outage SECONDS`, issue 37): the private
PostgreSQL is stopped as an administrator stops it once half the refunds have runs and a step is
in flight, and kept down while the rest of the customers keep sending the form.
Meanwhile a real web process is asked what an operator and a customer see (the admin, the form,
`/metrics`, `/healthz`); once the database is back, `/healthz` is followed until it is well, the
customer sends the form the outage kept for them, and the report says how soon the runs moved
and how many ERROR lines and tracebacks each process wrote.

Every wait is for something observed, with a deadline; the one sleep is the outage itself.
"""

from __future__ import annotations

import html
import http.cookiejar
import json
import math
import secrets
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.db import DatabaseError, connections
from prometheus_client.parser import text_string_to_metric_families

from agentflow._base.states import ACTIVE_RUN_STATUSES, StepStatus
from agentflow.models import StepCheckpoint, WorkflowRun
from agentflow.testing.processes import PostgresServer
from refunds.chaos.evidence import Evidence
from refunds.chaos.processes import Web
from refunds.chaos.traffic import Customer, HiddenInputs, Submission
from refunds.models import RefundRequest
from refunds.privacy import email_digest

#: An admin page an operator keeps open: the run list.
ADMIN_PAGE = "/admin/agentflow/workflowrun/"
FORM_PAGE = "/refunds/new/"
#: How long each observation may take: the web answers within seconds, even on a busy machine.
OBSERVE_SECONDS = 60.0
#: Steps in flight are what an outage must not lose: it waits this long for some.
IN_FLIGHT_WAIT_SECONDS = 30.0
#: How long it waits for half the refunds to have runs (the form is sent at its own rate).
RUNS_WAIT_SECONDS = 300.0
POLL_SECONDS = 0.05


@dataclass
class Page:
    status: int
    headers: dict[str, str]
    text: str

    def hidden_inputs(self) -> dict[str, str]:
        parser = HiddenInputs()
        parser.feed(self.text)
        return parser.values


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class Browser:
    """One person's browser: cookies kept, redirects not followed."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()), _NoRedirect()
        )

    def get(self, path: str, accept: str = "text/html") -> Page:
        return self._open(urllib.request.Request(self.base + path, headers={"Accept": accept}))

    def post(self, path: str, fields: dict[str, str]) -> Page:
        data = urllib.parse.urlencode(fields).encode()
        return self._open(urllib.request.Request(self.base + path, data=data))

    def _open(self, request: urllib.request.Request) -> Page:
        try:
            with self.opener.open(request, timeout=30) as response:
                return Page(response.status, dict(response.headers), response.read().decode())
        except urllib.error.HTTPError as answer:
            return Page(answer.code, dict(answer.headers), answer.read().decode(errors="replace"))
        except OSError as exc:
            return Page(0, {}, str(exc))


@dataclass
class Observed:
    """What the outage saw, in wall-clock seconds (time.time())."""

    seconds: float
    stopped_at: float = 0.0
    seen_down_at: float | None = None
    started_at: float = 0.0
    healthy_at: float | None = None
    in_flight: list[tuple[str, int]] = field(default_factory=list)
    active_runs: list[str] = field(default_factory=list)
    pages: dict[str, Any] = field(default_factory=dict)
    #: Every distinct /healthz answer from the restart until it said ok, in order.
    healthz_after: list[dict[str, Any]] = field(default_factory=list)
    resubmitted: dict[str, Any] = field(default_factory=dict)
    submission: Submission | None = None
    error: str = ""


class DatabaseOutage:
    """Stop `postgres` for `seconds` once steps are in flight, in a thread of its own."""

    def __init__(
        self,
        *,
        postgres: PostgresServer,
        web: Web,
        seconds: float,
        after_runs: int,
        customer: Customer,
        progress: Callable[[str], None],
    ) -> None:
        """`after_runs`: it begins once this many runs exist (and a step is in flight)."""
        self.postgres, self.web, self.customer, self.progress = postgres, web, customer, progress
        self.after_runs = after_runs
        self.observed = Observed(seconds=seconds)
        self.operator = Browser(web.url)
        self.visitor = Browser(web.url)
        self._form: dict[str, str] = {}
        self._thread = threading.Thread(target=self._run, name="chaos-outage", daemon=True)

    def prepare(self) -> None:
        """Before the outage: an operator logged in to the admin, and a customer with the form
        open and filled in."""
        password = secrets.token_urlsafe(16)
        get_user_model().objects.create_superuser("chaos-operator", password=password)
        login = self.operator.get("/admin/login/")
        answer = self.operator.post(
            "/admin/login/",
            {
                **login.hidden_inputs(),
                "username": "chaos-operator",
                "password": password,
                "next": ADMIN_PAGE,
            },
        )
        if answer.status != 302:
            raise RuntimeError(f"the operator could not log in: HTTP {answer.status}")
        form = self.visitor.get(FORM_PAGE)
        self._form = {
            **form.hidden_inputs(),
            "email": self.customer.email,
            "booking_reference": self.customer.booking_reference,
            "last_name": self.customer.last_name,
            "message": self.customer.message,
        }

    def start(self) -> None:
        self._thread.start()

    def finish(self, timeout: float) -> Observed:
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.observed.error = self.observed.error or "the outage did not end in time"
        return self.observed

    def _run(self) -> None:
        try:
            self._outage()
        except Exception as exc:  # said in the report; the run goes on and is judged as usual
            self.observed.error = f"{type(exc).__name__}: {exc}"
            if self.postgres.proc is None:
                self.postgres.start()

    def _outage(self) -> None:
        seen = self.observed
        _until(lambda: WorkflowRun.objects.count() >= self.after_runs, timeout=RUNS_WAIT_SECONDS)
        seen.in_flight = _wait_for_steps_in_flight()
        seen.active_runs = _active_runs()
        self.progress(
            f"chaos: stopping PostgreSQL for {seen.seconds:g} s "
            f"({len(seen.in_flight)} steps in flight)"
        )
        seen.stopped_at = time.time()
        self.postgres.halt()
        connections.close_all()  # this process's connections died with it
        down = _until(lambda: _healthz(self.web).get("database", "").startswith("error"))
        seen.seen_down_at = time.time() if down else None
        seen.pages = self._pages_while_down()
        # The outage itself: its length is the scenario, not a wait for an event.
        time.sleep(max(seen.stopped_at + seen.seconds - time.time(), 0.0))
        self.postgres.start()
        seen.started_at = time.time()
        self.progress("chaos: PostgreSQL is back")
        seen.healthy_at = self._follow_healthz()
        seen.resubmitted, seen.submission = self._send_the_kept_form()

    def _pages_while_down(self) -> dict[str, Any]:
        admin = self.operator.get(ADMIN_PAGE)
        sent = self.visitor.post(FORM_PAGE, self._form)
        kept = sent.hidden_inputs()
        if sent.status == 503:
            self._form = {**self._form, **kept}  # what the page gives back is sent again
        metrics = self.visitor.get("/metrics", accept="text/plain")
        return {
            "admin": {
                "status": admin.status,
                "retry_after": admin.headers.get("Retry-After"),
                "says_database_unreachable": "database is unreachable" in admin.text,
                "shows_customer_error_page": "If you had just sent the form" in admin.text,
            },
            "form": {
                "status": sent.status,
                "retry_after": sent.headers.get("Retry-After"),
                "kept_what_was_typed": all(
                    _html_has(sent.text, self._form[name])
                    for name in ("email", "booking_reference", "last_name", "message")
                ),
                "same_token": kept.get("submission_token") == self._form["submission_token"],
            },
            "metrics": _gauges(metrics),
            "healthz": _healthz(self.web),
        }

    def _follow_healthz(self) -> float | None:
        """Every distinct answer from the restart until /healthz says ok."""
        answers = self.observed.healthz_after
        deadline = time.monotonic() + OBSERVE_SECONDS
        while time.monotonic() < deadline:
            body = _healthz(self.web)
            shown = {key: body.get(key) for key in ("status", "database", "sweeper")}
            if not answers or {k: answers[-1].get(k) for k in shown} != shown:
                at = round(time.time() - self.observed.started_at, 2)
                answers.append({**shown, "at_seconds": at})
            if body.get("status") == "ok":
                return time.time()
            time.sleep(POLL_SECONDS)
        return None

    def _send_the_kept_form(self) -> tuple[dict[str, Any], Submission | None]:
        """The customer sends again what the 503 page kept: one refund, as if nothing
        happened."""
        answer = self.visitor.post(FORM_PAGE, self._form)
        location = answer.headers.get("Location", "")
        public_id = location.rstrip("/").rsplit("/", 1)[-1] if answer.status == 303 else ""
        made = list(
            RefundRequest.objects.filter(
                email_digest=email_digest(self.customer.email)
            ).values_list("public_id", "workflow_id")
        )
        submission = Submission(
            customer=self.customer,
            public_id=public_id,
            workflow_id=dict(made).get(public_id) or "",
            error="" if public_id else f"the kept form answered HTTP {answer.status}",
        )
        return {"status": answer.status, "requests_made": len(made)}, submission


def _wait_for_steps_in_flight() -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []

    def some() -> bool:
        found[:] = list(
            StepCheckpoint.objects.filter(status=StepStatus.IN_PROGRESS).values_list(
                "run_id", "seq"
            )
        )
        return bool(found)

    _until(some, timeout=IN_FLIGHT_WAIT_SECONDS)
    return found


def _active_runs() -> list[str]:
    return list(
        WorkflowRun.objects.filter(status__in=ACTIVE_RUN_STATUSES).values_list("id", flat=True)
    )


def _until(check: Callable[[], bool], *, timeout: float = OBSERVE_SECONDS) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return True
        except DatabaseError:
            connections.close_all()
        time.sleep(POLL_SECONDS)
    return False


def _healthz(web: Web) -> dict[str, Any]:
    page = Browser(web.url).get("/healthz", accept="application/json")
    try:
        body = json.loads(page.text)
    except ValueError:
        return {"http_status": page.status}
    return {"http_status": page.status, **body} if isinstance(body, dict) else {}


def _gauges(page: Page) -> dict[str, Any]:
    """What /metrics said of the database and the sweeper: present, and with which value."""
    if page.status != 200:
        return {"status": page.status}
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(page.text):
        for sample in family.samples:
            values.setdefault(sample.name, []).append(sample.value)
    sweeper = values.get("agentflow_sweeper_seconds_since_last_sweep", [])
    active = values.get("agentflow_runs_active", [])
    return {
        "status": page.status,
        "database_up": values.get("agentflow_database_up", [None])[0],
        "sweeper_gauge": "missing" if not sweeper else _shown(sweeper[0]),
        "runs_active_series": len(active),
        "runs_active_unknown": sum(1 for v in active if math.isnan(v)),
    }


def _shown(value: float) -> str | float:
    return "NaN" if math.isnan(value) else value


def _html_has(text: str, value: str) -> bool:
    return html.escape(value, quote=False) in text or html.escape(value) in text


def report(observed: Observed, evidence: Evidence, log_dir: Path) -> dict[str, Any]:
    """The outage's figures: what the pages answered, how soon the runs moved once the
    database answered, and every process's ERROR lines and tracebacks."""
    up = observed.started_at
    finished = []
    for run_id, seq in observed.in_flight:
        cp = evidence.checkpoints.get((run_id, seq))
        done = cp.finished_at.timestamp() if cp is not None and cp.finished_at else None
        if done is not None and up and done >= observed.stopped_at:  # interrupted, then done
            finished.append(done - up)
    moved = []
    for run_id in observed.active_runs:
        later = [
            moment.timestamp()
            for (r, _), cp in evidence.checkpoints.items()
            if r == run_id
            for moment in cp.times()
            if up and moment.timestamp() >= up
        ]
        if later:
            moved.append(min(later) - up)
    return {
        "seconds": observed.seconds,
        "stopped_for_seconds": round(up - observed.stopped_at, 2) if up else None,
        "noticed_by_web_after_seconds": _since(observed.seen_down_at, observed.stopped_at),
        "steps_in_flight": len(observed.in_flight),
        "runs_active": len(observed.active_runs),
        "while_down": observed.pages,
        "healthz_after_restart": observed.healthz_after,
        "healthz_blamed_beat": any(
            "celery beat" in str(answer.get("sweeper")) for answer in observed.healthz_after
        ),
        "healthy_after_seconds": _since(observed.healthy_at, up),
        "kept_form_sent_again": observed.resubmitted,
        "first_run_moved_after_seconds": round(min(moved), 3) if moved else None,
        "runs_moved_after_seconds_max": round(max(moved), 3) if moved else None,
        "steps_in_flight_finished_after_seconds_max": round(max(finished), 3) if finished else None,
        "log_lines": log_lines(log_dir),
        "error": observed.error,
    }


def _since(moment: float | None, start: float) -> float | None:
    return None if moment is None or not start else round(moment - start, 3)


def log_lines(log_dir: Path) -> dict[str, dict[str, int]]:
    """Per process log of the run (web, beat, each worker with its pool children): lines at
    ERROR or above, and tracebacks."""
    counts = {}
    for path in sorted(log_dir.glob("*.log")):
        if path.stem in ("postgres", "sandbox"):
            continue
        errors = tracebacks = 0
        for line in path.read_text(errors="replace").splitlines():
            tracebacks += line.count("Traceback (most recent call last)")
            try:
                level = str(json.loads(line).get("level", "")).lower()
            except (ValueError, AttributeError):
                level = "error" if " ERROR" in line or "ERROR/" in line else ""
            errors += level in ("error", "critical")
        counts[path.stem] = {"errors": errors, "tracebacks": tracebacks}
    return counts
