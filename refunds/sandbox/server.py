"""The sandbox's HTTP side: routes requests to partners and control endpoints; runs the servers."""

from __future__ import annotations

import logging
import re
import secrets
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import date
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from refunds.sandbox import (
    airline,
    crm,
    faults,
    flights,
    lookups,
    model,
    stripe_api,
    stripe_holds,
    stripe_lists,
    throttle,
)
from refunds.sandbox.idempotency import Effect, run_effect
from refunds.sandbox.ledger import ledger
from refunds.sandbox.messages import Invalid, Request, Response, partner_error, stripe_error
from refunds.sandbox.smtp import start_smtp
from refunds.sandbox.state import Store

logger = logging.getLogger(__name__)

BOOKING = re.compile(r"/airline/bookings/([^/]+)")
CANCEL_SEAT = re.compile(r"/airline/bookings/([^/]+)/cancel-seat")
REINSTATE_SEAT = re.compile(r"/airline/bookings/([^/]+)/reinstate-seat")
INTENT = re.compile(r"/v1/payment_intents/([^/]+)")
CAPTURE = re.compile(r"/v1/payment_intents/([^/]+)/capture")
CANCEL_INTENT = re.compile(r"/v1/payment_intents/([^/]+)/cancel")


class Sandbox:
    """Request in, response out: no sockets here, so the routing is plain to read and test."""

    def __init__(
        self,
        store: Store,
        *,
        key_window_seconds: float,
        authorization_seconds: float = stripe_holds.AUTHORIZATION_SECONDS,
        today_offset_days: int = 0,
    ) -> None:
        self.store = store
        self.key_window_seconds = key_window_seconds
        self.authorization_seconds = authorization_seconds
        self.barriers = faults.Barriers()
        self.throttle = throttle.Throttle()
        self.today_offset_days = today_offset_days

    def today(self) -> date:
        """The airline's today, read on every request (its bookings and schedule follow it)."""
        return airline.today(offset_days=self.today_offset_days)

    def handle(self, request: Request) -> Response:
        try:
            response = self._limited(request)
        except Invalid as rejected:
            response = rejected.response
        except Exception:
            logger.exception("sandbox failed on %s %s", request.method, request.path)
            response = Response(status=500, body={"error": "sandbox_bug"})
        if request.path.startswith("/v1/"):
            extra = {"Request-Id": f"req_{secrets.token_hex(7)}"}
            key = request.header("Idempotency-Key")
            if key:
                extra["Idempotency-Key"] = key
            response = replace(response, headers={**response.headers, **extra})
        return response

    def _limited(self, request: Request) -> Response:
        """A partner playing limited answers 429 past its limit, before anything executes."""
        partner = throttle.partner_of(request.path)
        if partner is None:
            return self._route(request)
        with self.throttle.request(partner) as refused:
            return refused if refused is not None else self._route(request)

    def _route(self, request: Request) -> Response:
        method, path = request.method, request.path.rstrip("/") or "/"
        if path.startswith("/_sandbox/"):
            return self._control(method, path, request)
        if method == "POST" and path == "/v1/chat/completions":
            return self._read("llm.chat", model.error, lambda: model.chat_completion(request))
        if path.startswith("/v1/"):
            return self._stripe(method, path, request)
        if method == "GET" and (match := BOOKING.fullmatch(path)):
            reference = match.group(1)
            return self._read(
                "airline.booking",
                airline.injected,
                lambda: airline.get_booking(self.store, reference, today=self.today()),
            )
        if method == "GET" and path == "/airline/schedule":
            return self._read(
                "airline.schedule",
                airline.injected,
                lambda: airline.get_schedule(request, today=self.today()),
            )
        if method == "GET" and path == "/airline/manifest":
            return self._read(
                "airline.manifest",
                airline.injected,
                lambda: flights.get_manifest(self.store, request),
            )
        if method == "POST" and (match := CANCEL_SEAT.fullmatch(path)):
            return self._effect(airline.cancel_seat(self.store, match.group(1)), request)
        if method == "POST" and (match := REINSTATE_SEAT.fullmatch(path)):
            return self._effect(airline.reinstate_seat(self.store, match.group(1)), request)
        if method == "POST" and path == "/airline/boarding-passes":
            return self._effect(airline.boarding_pass(self.store), request)
        if method == "POST" and path == "/crm/updates":
            return self._effect(crm.UPDATE, request)
        if method == "GET" and (kind := lookups.BY_KEY.get(path)):
            return self._read(
                f"{kind}.lookup",
                airline.injected,
                lambda: lookups.effects_by_key(self.store, kind, request),
            )
        return partner_error(404, "not_found", f"no route for {method} {path}")

    def _stripe(self, method: str, path: str, request: Request) -> Response:
        denied = stripe_api.check_auth(request)
        if denied is not None:
            return denied
        stripe_holds.expire(self.store, after_seconds=self.authorization_seconds)
        if method == "POST" and path == "/v1/payment_intents":
            return self._effect(stripe_api.CREATE_INTENT, request)
        if method == "POST" and (match := CAPTURE.fullmatch(path)):
            return self._effect(stripe_holds.capture(match.group(1)), request)
        if method == "POST" and (match := CANCEL_INTENT.fullmatch(path)):
            return self._effect(stripe_holds.cancel(match.group(1)), request)
        if method == "POST" and path == "/v1/refunds":
            return self._effect(stripe_api.CREATE_REFUND, request)
        if method == "GET" and path == "/v1/refunds":
            return self._read(
                "refunds.list",
                stripe_api.injected,
                lambda: stripe_lists.list_refunds(self.store, request),
            )
        if method == "GET" and path == "/v1/payment_intents":
            return self._read(
                "payment_intents.list",
                stripe_api.injected,
                lambda: stripe_lists.list_intents(self.store, request),
            )
        if method == "GET" and path == "/v1/payment_intents/search":
            return self._read(
                "payment_intents.search",
                stripe_api.injected,
                lambda: stripe_api.search_intents(self.store, request),
            )
        if method == "GET" and (match := INTENT.fullmatch(path)):
            intent_id = match.group(1)
            return self._read(
                "payment_intents.retrieve",
                stripe_api.injected,
                lambda: stripe_api.retrieve_intent(self.store, intent_id),
            )
        return stripe_error(
            404, "invalid_request_error", f"Unrecognized request URL ({method}: {path})."
        )

    def _effect(self, effect: Effect, request: Request) -> Response:
        return run_effect(self.store, effect, request, key_window_seconds=self.key_window_seconds)

    def _read(
        self, name: str, injected: Callable[[int], Response], answer: Callable[[], Response]
    ) -> Response:
        """A read: counted and open to faults, but with nothing to store or replay."""
        self.store.count("requests", name)
        fault = faults.plan(self.store, name)
        if fault.error_status is not None:
            return injected(fault.error_status)
        if fault.barrier:
            self.barriers.meet(name, fault.barrier, fault.barrier_timeout_ms)
        if fault.latency_ms:
            time.sleep(fault.latency_ms / 1000)
        return replace(answer(), drop=fault.drop)

    def _control(self, method: str, path: str, request: Request) -> Response:
        if method == "GET" and path == "/_sandbox/health":
            return Response(status=200, body={"status": "ok"})
        if method == "GET" and path == "/_sandbox/ledger":
            stripe_holds.expire(self.store, after_seconds=self.authorization_seconds)
            return Response(
                status=200, body=ledger(self.store, workflow_id=request.query.get("workflow_id"))
            )
        if path == "/_sandbox/faults" and method in ("GET", "POST", "DELETE"):
            if method == "POST":
                try:
                    faults.configure(self.store, request.json())
                except ValueError as exc:
                    return partner_error(400, "invalid_fault", str(exc))
            elif method == "DELETE":
                faults.clear(self.store)
                self.barriers.release()
            return Response(status=200, body=faults.describe(self.store, self.barriers))
        if path == "/_sandbox/limits" and method in ("GET", "POST"):
            if method == "POST":
                try:
                    self.throttle.configure(request.json())
                except ValueError as exc:
                    return partner_error(400, "invalid_limits", str(exc))
            return Response(status=200, body=self.throttle.report())
        if method == "POST" and path == "/_sandbox/forget":
            return stripe_lists.forget(self.store, request.json())
        if method == "POST" and path == "/_sandbox/airline/cancel-flight":
            return flights.cancel_flight(self.store, request, today=self.today())
        if method == "POST" and path == "/_sandbox/reset":
            self.store.reset()
            self.barriers.release()
            self.throttle = throttle.Throttle()
            return Response(status=200, body={"status": "reset"})
        return partner_error(404, "not_found", f"no route for {method} {path}")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the stripe library's requests session expects
    server_version = "agentflow-sandbox"
    server: SandboxHTTPServer

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def _serve(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        split = urlsplit(self.path)
        request = Request(
            method=self.command,
            path=split.path,
            query=dict(parse_qsl(split.query, keep_blank_values=True)),
            headers={name.lower(): value for name, value in self.headers.items()},
            body=body,
        )
        response = self.server.app.handle(request)
        if response.drop:
            # The effect is done and stored; the client gets a closed socket and no answer.
            self.close_connection = True
            return
        data = response.encode()
        self.send_response(response.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a chaos run makes thousands of requests; the ledger counts them instead."""


class SandboxHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # load and chaos runs open many connections at once

    def __init__(self, address: tuple[str, int], app: Sandbox) -> None:
        super().__init__(address, _Handler)
        self.app = app


class _Stop(Exception):
    """Raised from the SIGTERM handler so `serve_forever` unwinds like on Ctrl-C."""


def _stop(signum: int, frame: Any) -> None:
    raise _Stop


def serve(
    *,
    host: str,
    port: int,
    smtp_port: int,
    state_path: str | Path,
    key_window_seconds: float,
    authorization_seconds: float = stripe_holds.AUTHORIZATION_SECONDS,
    today_offset_days: int = 0,
    on_ready: Callable[[str], None] | None = None,
    limits: dict[str, Any] | None = None,
) -> None:
    """Run the HTTP and SMTP servers until Ctrl-C or SIGTERM, then close both and the store."""
    store = Store(state_path)
    app = Sandbox(
        store,
        key_window_seconds=key_window_seconds,
        authorization_seconds=authorization_seconds,
        today_offset_days=today_offset_days,
    )
    if limits:
        app.throttle.configure(limits)
    httpd = SandboxHTTPServer((host, port), app)
    smtp = start_smtp(store, host=host, port=smtp_port)
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        if on_ready is not None:
            on_ready(
                f"Partner sandbox: http://{host}:{port} "
                f"(SMTP {host}:{smtp_port}, state {store.path}; the airline's today is "
                f"{app.today().isoformat()})"
            )
        httpd.serve_forever()
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        if on_ready is not None:
            for name, seen in app.throttle.report().items():
                if seen["requests"]:
                    on_ready(
                        f"{name}: {seen['requests']} requests, {seen['rate_limited']} answered "
                        f"429, at most {seen['most_per_second']} in a second and "
                        f"{seen['most_in_flight']} in flight"
                    )
        httpd.server_close()
        smtp.stop()
        store.close()
