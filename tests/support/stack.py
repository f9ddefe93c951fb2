"""The rest of the production stack as real processes: gunicorn (web), celery beat, and an
OTLP/HTTP collector that receives the spans every process exports.

- `WebProcess(env)`: `gunicorn config.wsgi` with two workers on a free port; `.url`, `.get()`,
  `.submit_refund()` (the form, as a browser sends it), `.log_path`.
- `BeatProcess(env)`: a standalone `celery beat`; `.stop()` kills it, `.start()` starts it again.
- `SpanCollector`: a tiny OTLP/HTTP receiver on a free port (`.endpoint` for
  OTEL_EXPORTER_OTLP_ENDPOINT); `.spans()` lists what arrived, decoded with opentelemetry-proto.
"""

from __future__ import annotations

import contextlib
import http.cookiejar
import http.server
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentflow.testing.processes import free_port
from agentflow.testing.waiting import wait_for
from refunds.sandbox.airline import owner_of
from tests.support.airline_days import new_flight

ROOT = Path(__file__).resolve().parents[2]


class _Process:
    """A subprocess in its own process group, its output in a log file."""

    def __init__(
        self, args: list[str], env: Mapping[str, str], log_path: Path, *, cwd: Path = ROOT
    ) -> None:
        self.args = args
        self.env = {**os.environ, **env}
        self.log_path = log_path
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.args,
                env=self.env,
                cwd=self.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGKILL the whole group: what an OOM kill or a lost node does."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.proc = None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


class WebProcess(_Process):
    def __init__(
        self, env: Mapping[str, str], log_path: Path, *, workers: int = 2, cwd: Path = ROOT
    ) -> None:
        """`cwd`: the checkout it serves (a second tree, for a deploy)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [
            sys.executable,
            "-m",
            "gunicorn",
            "config.wsgi",
            "--no-control-socket",
            "--bind",
            f"127.0.0.1:{self.port}",
            "--workers",
            str(workers),
        ]
        super().__init__(args, env, log_path, cwd=cwd)

    def start(self) -> None:
        super().start()

        def up() -> bool:
            assert self.alive(), self.log()[-3000:]
            return self.get("/refunds/new/")[0] == 200

        wait_for(up, timeout=60, what=f"gunicorn at {self.url}")

    def get(self, path: str, headers: Mapping[str, str] | None = None) -> tuple[int, bytes]:
        request = urllib.request.Request(self.url + path, headers=dict(headers or {}))
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except OSError:
            return 0, b""

    def submit_refund(self, reference: str, **fields: str) -> str:
        """Open the form, fill it in as the booking's owner (with `fields`, e.g. a fee waiver's
        `waiver_reason` and `waiver_details`), send it; returns the refund's public id."""
        owner = owner_of(reference)
        cookies = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(cookies), _NoRedirect()
        )
        form = opener.open(f"{self.url}/refunds/new/", timeout=10).read().decode()
        hidden = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form))
        data = urllib.parse.urlencode(
            {
                **hidden,
                "email": owner.email,
                "booking_reference": reference,
                "last_name": owner.last_name,
                "message": new_flight().words("Please move me to {flight} on {date}. Thanks!"),
                **fields,
            }
        ).encode()
        try:
            opener.open(f"{self.url}/refunds/new/", data=data, timeout=30)
        except urllib.error.HTTPError as redirect:
            assert redirect.code == 303, redirect.read()[:2000]
            return redirect.headers["Location"].rstrip("/").rsplit("/", 1)[-1]
        raise AssertionError("the form did not answer 303")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


class BeatProcess(_Process):
    def __init__(self, env: Mapping[str, str], log_path: Path, *, cwd: Path = ROOT) -> None:
        schedule = log_path.with_suffix(".schedule")
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config.celery_app",
            "beat",
            "-l",
            "info",
            "--schedule",
            str(schedule),
        ]
        super().__init__(args, env, log_path, cwd=cwd)


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    service: dict[str, Any]
    #: OTLP status code: 0 unset, 1 ok, 2 error.
    status_code: int


class SpanCollector:
    """Receives OTLP/HTTP protobuf trace exports on 127.0.0.1 and keeps every span."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path == "/v1/traces":
                    collector._receive(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> SpanCollector:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _receive(self, body: bytes) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        request = ExportTraceServiceRequest.FromString(body)
        received = []
        for resource_spans in request.resource_spans:
            service = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            attributes=_attributes(span.attributes),
                            service=service,
                            status_code=span.status.code,
                        )
                    )
        with self._lock:
            self._spans.extend(received)

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _value(value: Any) -> Any:
    """An OTLP AnyValue as Python: an array (`gen_ai.response.finish_reasons`) as a list."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None
