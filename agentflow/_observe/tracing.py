"""OpenTelemetry traces: one trace per run, from the request that started it through every step.

Through OpenTelemetry's API and its global provider, which the host configures (this repo's site:
`config.tracing`, when OTEL_EXPORTER_OTLP_ENDPOINT is set). With no SDK installed, `enabled` is
False and every hook returns at its first line, so tracing costs a step nothing when it is off.

How a run stays in one trace:
- the run's first context (the form POST's span, or a root span when a script starts it) is
  kept on the run row (`trace_parent`, W3C traceparent), written only when tracing is on;
- each step message carries its publisher's context in the message headers (Celery's
  `before_task_publish`, which `dispatch` fires too), so a step's span is the child of the step
  that published it: the POST, then step 1, step 2, ... each parent-linked;
- a message published outside the run's trace (the sweeper's re-publish, an operator's retry
  from the admin) carries none, and the worker parents the step on the stored context instead.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import MiddlewareNotUsed
from django.http import HttpRequest, HttpResponse
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from agentflow._core.dispatch import RUN_STEP_TASK

ATTRIBUTE_PREFIX = "agentflow."
_propagator = TraceContextTextMapPropagator()
#: The runs whose traces the current code works in, and the context each hands on to its step
#: messages: set by the step span in a worker and by `run_started` in the request that created
#: the run. Copied on write, so a reset token restores the previous mapping. None outside a
#: request or a step: a script starting runs keeps nothing (its messages then carry no context
#: and the worker uses the stored one).
_run_traces: contextvars.ContextVar[Mapping[str, otel_context.Context] | None] = (
    contextvars.ContextVar("agentflow_run_traces", default=None)
)
_NO_PROVIDER = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def enabled() -> bool:
    """True once the host installed an SDK as OpenTelemetry's global provider (this repo's
    site does when OTEL_EXPORTER_OTLP_ENDPOINT is set, `config.tracing`)."""
    return not isinstance(trace.get_tracer_provider(), _NO_PROVIDER)


def _tracer() -> trace.Tracer:
    return trace.get_tracer("agentflow")


def attributes(**values: Any) -> dict[str, Any]:
    """`agentflow.`-prefixed span attributes, without the empty ones."""
    return {ATTRIBUTE_PREFIX + key: value for key, value in values.items() if value is not None}


def traceparent(span_context: otel_context.Context | None = None) -> str:
    """The W3C traceparent of a context (default: the current one), or "" if it has no span."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=span_context)
    return carrier.get("traceparent", "")


def context_from(traceparent_value: str | None) -> otel_context.Context | None:
    if not traceparent_value:
        return None
    found = _propagator.extract({"traceparent": traceparent_value})
    return found if trace.get_current_span(found).get_span_context().is_valid else None


# --- the run's first span ---------------------------------------------------------------------
def run_started(run_id: str, workflow: str) -> str:
    """Tag the current span (the form POST) with the run, or open a root span for a run started
    outside any; returns the context the run's steps hang under (its traceparent)."""
    current = trace.get_current_span()
    if current.is_recording() and not _run_traces.get():
        current.set_attributes(attributes(run_id=run_id, workflow=workflow))
        parent = otel_context.get_current()
    else:  # a script, or a step of another run: a span of its own (a child if there is a parent)
        root = _tracer().start_span(
            f"run {workflow}", kind=SpanKind.PRODUCER, attributes=attributes(run_id=run_id)
        )
        root.end()
        parent = trace.set_span_in_context(root)
    scope = _run_traces.get()
    if scope is not None:
        _run_traces.set({**scope, run_id: parent})
    return traceparent(parent)


# --- step messages ----------------------------------------------------------------------------
def inject_into_step_message(
    sender: str | None = None,
    body: Any = None,
    headers: dict[str, Any] | None = None,
    **kwargs: Any,
) -> None:
    """before_task_publish (connected by the app's `ready`): a step message of the run we are
    tracing carries our context."""
    if not enabled():
        return
    if sender != RUN_STEP_TASK or headers is None:
        return
    args = body[0] if isinstance(body, list | tuple) and body else None
    found = (_run_traces.get() or {}).get(args[0]) if args else None
    if found is None:
        return  # not in this run's trace: the worker parents the step on the stored context
    _propagator.inject(headers, context=found)


def message_context(request: Any) -> otel_context.Context | None:
    """The context a step message carried (Celery puts message headers on the request)."""
    value = getattr(request, "traceparent", None)
    if value is None and isinstance(getattr(request, "headers", None), Mapping):
        value = request.headers.get("traceparent")
    return context_from(value)


class StepSpan:
    """The span of one step attempt, current (so its publishes and partner calls are its
    children) from `start` until `end`."""

    def __init__(self, run_id: str, name: str, parent: otel_context.Context | None, **attrs: Any):
        self.span: Span = _tracer().start_span(
            f"step {name}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes(run_id=run_id, step=name, **attrs),
        )
        here = trace.set_span_in_context(self.span)
        self._token = otel_context.attach(here)
        self._run_token = _run_traces.set({**(_run_traces.get() or {}), run_id: here})

    def event(
        self, name: str, *, failed: bool = False, values: Mapping[str, Any] | None = None
    ) -> None:
        self.span.add_event(name, attributes(**(values or {})))
        if failed:
            self.span.set_status(Status(StatusCode.ERROR, name))

    def end(self, error: BaseException | None = None) -> None:
        if error is not None:
            self.span.record_exception(error)
            self.span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        _run_traces.reset(self._run_token)
        otel_context.detach(self._token)
        self.span.end()


@contextmanager
def partner_span(partner: str, operation: str, **attrs: Any) -> Iterator[Span | None]:
    """A client span around one partner call (None when tracing is off)."""
    if not enabled():
        yield None
        return
    with _tracer().start_as_current_span(
        f"{partner} {operation}",
        kind=SpanKind.CLIENT,
        attributes=attributes(partner=partner, operation=operation, **attrs),
    ) as span:
        yield span


# --- agent runs: OpenTelemetry's GenAI conventions ----------------------------------------------
@contextmanager
def model_request_span(
    *, request_model: str, provider: str, server: str, max_tokens: int | None, **attrs: Any
) -> Iterator[Span]:
    """A client span around one model request, named and tagged as OpenTelemetry's GenAI
    semantic conventions say (`chat gpt-4o-mini`, `gen_ai.request.model`, ...), so dashboards
    built for them read an agent run's turns; `model_answered` adds what the answer said. Only
    called with tracing on (the conventions' names come with the SDK)."""
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai

    operation = gen_ai.GenAiOperationNameValues.CHAT.value
    values: dict[str, Any] = {
        gen_ai.GEN_AI_OPERATION_NAME: operation,
        gen_ai.GEN_AI_PROVIDER_NAME: provider,
        gen_ai.GEN_AI_REQUEST_MODEL: request_model,
        **_server_attributes(server),
        **attributes(**attrs),
    }
    if max_tokens:
        values[gen_ai.GEN_AI_REQUEST_MAX_TOKENS] = max_tokens
    with _tracer().start_as_current_span(
        f"{operation} {request_model}", kind=SpanKind.CLIENT, attributes=values
    ) as span:
        try:
            yield span
        except BaseException as exc:
            span.set_attribute(_error_type(), type(exc).__qualname__)
            raise


def model_answered(
    span: Span,
    *,
    response_model: str,
    finish_reason: str,
    input_tokens: int,
    output_tokens: int,
    provider: str = "",
    server: str = "",
    **attrs: Any,
) -> None:
    """What the answer to `model_request_span`'s request said: the model that answered, its
    tokens, why it stopped (and the server that answered, when another than asked)."""
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai

    values: dict[str, Any] = {
        gen_ai.GEN_AI_RESPONSE_MODEL: response_model,
        gen_ai.GEN_AI_RESPONSE_FINISH_REASONS: [finish_reason],
        gen_ai.GEN_AI_USAGE_INPUT_TOKENS: input_tokens,
        gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: output_tokens,
        **(_server_attributes(server) if server else {}),
        **attributes(**attrs),
    }
    if provider:
        values[gen_ai.GEN_AI_PROVIDER_NAME] = provider
    span.set_attributes(values)


@contextmanager
def tool_call_span(*, tool: str, call_id: str | None, **attrs: Any) -> Iterator[Span]:
    """A span around one tool call the model asked for (`execute_tool fetch_booking`)."""
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai

    operation = gen_ai.GenAiOperationNameValues.EXECUTE_TOOL.value
    values: dict[str, Any] = {
        gen_ai.GEN_AI_OPERATION_NAME: operation,
        gen_ai.GEN_AI_TOOL_NAME: tool,
        gen_ai.GEN_AI_TOOL_TYPE: "function",
        **attributes(**attrs),
    }
    if call_id:
        values[gen_ai.GEN_AI_TOOL_CALL_ID] = call_id
    with _tracer().start_as_current_span(
        f"{operation} {tool}", kind=SpanKind.INTERNAL, attributes=values
    ) as span:
        try:
            yield span
        except BaseException as exc:
            span.set_attribute(_error_type(), type(exc).__qualname__)
            raise


def _server_attributes(base_url: str) -> dict[str, Any]:
    from opentelemetry.semconv.attributes import server_attributes

    found = urlsplit(base_url) if base_url else None
    if found is None or not found.hostname:
        return {}
    port = found.port or (443 if found.scheme == "https" else 80)
    return {server_attributes.SERVER_ADDRESS: found.hostname, server_attributes.SERVER_PORT: port}


def _error_type() -> str:
    from opentelemetry.semconv.attributes import error_attributes

    return error_attributes.ERROR_TYPE


# --- web requests -----------------------------------------------------------------------------
class RequestSpanMiddleware:
    """A server span per request (named by method and route), so a run's trace starts at the
    form POST. Removed from the chain at start-up when tracing is off."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        if not enabled():
            raise MiddlewareNotUsed
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        run_token = _run_traces.set({})  # nothing carries over between requests on a thread
        try:
            with _tracer().start_as_current_span(
                f"{request.method} {request.path}",
                kind=SpanKind.SERVER,
                attributes={"http.request.method": request.method, "url.path": request.path},
            ) as span:
                response = self.get_response(request)
                span.set_attribute("http.response.status_code", response.status_code)
                match = getattr(request, "resolver_match", None)
                if match is not None and match.route:
                    span.update_name(f"{request.method} /{match.route}")
                if response.status_code >= 500:
                    span.set_status(Status(StatusCode.ERROR))
                return response
        finally:
            _run_traces.reset(run_token)
