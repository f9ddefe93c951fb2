"""Tracing in one process with the SDK's in-memory exporter: the request span a run starts in,
the context its step messages carry to the real Redis, and a partner call's span under its step.

Across real gunicorn and worker processes (OTLP/HTTP): tests/config/acceptance/test_operations.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from agentflow import durable
from agentflow._observe import telemetry, tracing
from agentflow.models import WorkflowRun
from agentflow.testing.processes import RedisServer
from config import tracing as site_tracing
from refunds.gateways import PaymentGateway
from refunds.sandbox.airline import owner_of
from tests.support.airline_days import new_flight
from tests.support.sandbox import SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = site_tracing.configure(exporter=exporter)
    assert provider is not None
    try:
        yield exporter
    finally:
        provider.shutdown()
        # OpenTelemetry sets its global provider once a process; a test takes it back.
        trace._TRACER_PROVIDER_SET_ONCE = Once()
        trace._TRACER_PROVIDER = None


def queued_headers(broker: RedisServer) -> list[dict[str, Any]]:
    return [json.loads(raw)["headers"] for raw in broker.queued_messages()]


def test_off__no_tracer_no_middleware_nothing_stored(broker: RedisServer) -> None:
    assert not tracing.enabled()
    run_id = durable.start("demo", input={"name": "quiet"})

    assert WorkflowRun.objects.get(pk=run_id).trace_parent == ""
    assert "traceparent" not in queued_headers(broker)[0]


def test_form_post__its_span_names_the_run_and_step_one_carries_its_context(
    spans: InMemorySpanExporter, broker: RedisServer
) -> None:
    client = Client()  # after configure: the middleware is loaded with tracing on
    owner = owner_of("TRC123")
    form = client.get("/refunds/new/").content.decode()
    token = form.split('name="submission_token" value="', 1)[1].split('"', 1)[0]
    response = client.post(
        "/refunds/new/",
        {
            "email": owner.email,
            "last_name": owner.last_name,
            "booking_reference": "TRC123",
            "submission_token": token,
            "message": new_flight().words(),
        },
    )
    assert response.status_code == 303

    [post] = [s for s in spans.get_finished_spans() if s.name == "POST /refunds/new/"]
    run_id = post.attributes["agentflow.run_id"]
    run = WorkflowRun.objects.get(pk=run_id)
    trace_id = f"{post.context.trace_id:032x}"
    span_id = f"{post.context.span_id:016x}"
    assert run.trace_parent.startswith(f"00-{trace_id}-{span_id}-")
    [headers] = queued_headers(broker)
    assert headers["traceparent"] == run.trace_parent  # through dispatch's own publish path


def test_message_of_another_run__carries_no_context_the_worker_uses_the_stored_one(
    spans: InMemorySpanExporter, broker: RedisServer
) -> None:
    first = durable.start("demo", input={"name": "a"})  # a root span of its own: no request
    [root] = spans.get_finished_spans()
    assert root.name == "run demo" and root.attributes["agentflow.run_id"] == first
    stored = WorkflowRun.objects.get(pk=first).trace_parent
    assert stored.split("-")[1] == f"{root.context.trace_id:032x}"

    broker.client().flushall()
    from agentflow._core import dispatch

    dispatch.send_step(first, 1)  # as the sweeper does: outside the run's trace
    [headers] = queued_headers(broker)
    assert "traceparent" not in headers

    class Request:  # a Celery request without the header
        traceparent = None

    with telemetry.step_message(first, 1, Request()):
        telemetry.step_started(
            run_id=first, workflow="demo", seq=1, step="greet", kind="read", attempt=1
        )
    step = next(s for s in spans.get_finished_spans() if s.name == "step greet")
    assert step.parent.span_id == root.context.span_id
    assert step.context.trace_id == root.context.trace_id


def test_partner_call__a_client_span_under_its_step_with_run_step_and_key(
    spans: InMemorySpanExporter, clean_sandbox: SandboxProcess
) -> None:
    gateway = PaymentGateway(api_key="sk_test_x", api_base=clean_sandbox.url)
    with telemetry.step_message("wf_trace", 7):
        telemetry.step_started(
            run_id="wf_trace",
            workflow="refund",
            seq=7,
            step="charge_customer",
            kind="effect",
            attempt=2,
        )
        gateway.authorize(
            amount_cents=4500,
            currency="usd",
            payment_method="pm_card_visa",
            description="fee",
            key="wf_trace_step_7",
            workflow_id="wf_trace",
        )

    finished = {s.name: s for s in spans.get_finished_spans()}
    charge, step = finished["stripe authorize"], finished["step charge_customer"]
    assert charge.parent.span_id == step.context.span_id
    assert charge.attributes["agentflow.run_id"] == "wf_trace"
    assert charge.attributes["agentflow.step"] == "charge_customer"
    assert charge.attributes["agentflow.idempotency_key"] == "wf_trace_step_7"
    assert step.attributes["agentflow.attempt"] == 2  # each retry is a span of its own


def test_partner_call__an_error_marks_the_span(
    spans: InMemorySpanExporter, clean_sandbox: SandboxProcess
) -> None:
    clean_sandbox.set_fault(endpoint="payment_intents.create", error_rate=1.0, error_status=500)
    gateway = PaymentGateway(api_key="sk_test_x", api_base=clean_sandbox.url)
    with pytest.raises(durable.RetryableStepError):
        gateway.authorize(
            amount_cents=4500,
            currency="usd",
            payment_method="pm_card_visa",
            description="fee",
            key="wf_err_step_7",
            workflow_id="wf_err",
        )
    # Each request is a partner call of its own (the gateway's retries included, so the
    # partner's limit counts them): every one answered 500 is a span marked with the error.
    charges = [s for s in spans.get_finished_spans() if s.name == "stripe authorize"]
    assert charges
    for charge in charges:
        assert not charge.status.is_ok
        assert charge.events[0].name == "exception"
