"""This site's OpenTelemetry SDK: spans batched to OTEL_EXPORTER_OTLP_ENDPOINT over OTLP/HTTP.

The engine only speaks the API (`agentflow._observe.tracing`) and traces once a global provider
is set; each process entry point (wsgi, the Celery app) calls `configure` once Django's settings
load.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter

from agentflow.logs import process_kind


def configure(exporter: SpanExporter | None = None) -> TracerProvider | None:
    """Install the SDK as the global provider: with `exporter` (tests: the SDK's in-memory one)
    spans are handed over as they end; otherwise, with OTEL_EXPORTER_OTLP_ENDPOINT set, they
    are batched to it. Neither: nothing is installed and tracing stays off."""
    if exporter is None:
        if not settings.OTEL_EXPORTER_OTLP_ENDPOINT:
            return None
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        processor: Any = BatchSpanProcessor(OTLPSpanExporter())
    else:
        processor = SimpleSpanProcessor(exporter)
    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, when set, win over these defaults.
    resource = Resource.create({"service.name": "agentflow", "process.kind": process_kind()})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    return provider
