"""An agent run's GenAI telemetry from real worker processes (issue 28): every model request a
`chat <model>` span with OpenTelemetry's GenAI attributes, every tool call an `execute_tool
<name>` span, all in the run's trace; a SIGKILL and the replay after it add no request span
for a turn that was recorded.

Spans go over OTLP/HTTP to a collector this test runs; the run's own trace starts in this
process (the SDK's in-memory exporter), where the run is created.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.util._once import Once

from agentflow import durable
from agentflow.models import StepCheckpoint, WorkflowRun
from agentflow.testing.waiting import wait_for
from config import tracing as site_tracing
from refunds.agent.planner import plan_refund
from tests.support.agent_workers import AgentWorker
from tests.support.llm_server import LLMServer, SeenRequest, planned_by, stall
from tests.support.refunds import finished, submit
from tests.support.sandbox import SandboxProcess
from tests.support.stack import ReceivedSpan, SpanCollector

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def traced_here() -> Iterator[InMemorySpanExporter]:
    """Tracing on in this process, so the run created here keeps a trace of its own."""
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


def of_run(spans: list[ReceivedSpan], run_id: str, name_prefix: str) -> list[ReceivedSpan]:
    return [
        s
        for s in spans
        if s.name.startswith(name_prefix) and s.attributes.get("agentflow.run_id") == run_id
    ]


def test_sigkill_while_turn_3_is_asked__one_request_span_per_recorded_turn_in_the_runs_trace(
    traced_here: InMemorySpanExporter,
    agent_worker: AgentWorker,
    llm_server: LLMServer,
    clean_sandbox: SandboxProcess,
) -> None:
    planner = planned_by(plan_refund)
    asked_turn_3 = []

    def script(seen: SeenRequest) -> Any:
        if seen.turn == 3 and not asked_turn_3:
            asked_turn_3.append(seen)
            return stall(120)  # its worker is killed while it waits for this answer
        return planner(seen)

    llm_server.script(script)
    with SpanCollector() as collector:
        traced = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        first = agent_worker(**traced)
        run_id = submit("AGT001")
        run_trace = WorkflowRun.objects.get(pk=run_id).trace_parent.split("-")[1]

        # Turns 1 and 2 recorded and their spans exported; turn 3 asked, unanswered: kill.
        wait_for(lambda: asked_turn_3, timeout=60, what="turn 3 to be asked")

        def before_turn_3() -> bool:
            spans = collector.spans()
            tools = {s.name for s in of_run(spans, run_id, "execute_tool ")}
            return len(of_run(spans, run_id, "chat ")) == 2 and tools == {
                "execute_tool load_request",
                "execute_tool fetch_booking",
                "execute_tool check_cancellation_policy",
            }

        try:
            wait_for(before_turn_3, timeout=30, what="the spans of turns 1 and 2 and their tools")
        except AssertionError:
            print([(s.name, s.attributes.get("agentflow.seq")) for s in collector.spans()])
            raise
        first.kill()
        second = agent_worker(**traced)
        run = finished(run_id, second, timeout=90)
        assert run.status == durable.RunStatus.COMPLETED, run.error

        turns = list(StepCheckpoint.objects.filter(run_id=run_id, name="llm").order_by("seq"))
        tools = list(
            StepCheckpoint.objects.filter(run_id=run_id, arguments__kind="tool").order_by("seq")
        )

        def all_exported() -> list[ReceivedSpan] | None:
            spans = collector.spans()
            done = len(of_run(spans, run_id, "execute_tool ")) == len(tools)
            return spans if done and len(of_run(spans, run_id, "chat ")) >= len(turns) else None

        try:
            spans = wait_for(all_exported, timeout=30, what="every GenAI span to be exported")
        except AssertionError:
            print([(s.name, s.attributes.get("agentflow.seq")) for s in collector.spans()])
            print([(t.seq, t.name) for t in tools])
            raise

    requests = of_run(spans, run_id, "chat ")
    # One request span per recorded turn: turns 1 and 2, recorded before the kill, were
    # replayed after it without a request; turn 3's lost request never ended its span.
    assert sorted(s.attributes["agentflow.seq"] for s in requests) == [t.seq for t in turns]
    assert len(llm_server.requests) == len(turns) + 1  # turn 3 was asked twice
    for span, turn in zip(
        sorted(requests, key=lambda s: s.attributes["agentflow.seq"]), turns, strict=True
    ):
        usage = turn.output["usage"]
        assert span.name == "chat test-model"
        assert span.trace_id == run_trace
        assert span.attributes[gen_ai.GEN_AI_OPERATION_NAME] == "chat"
        assert span.attributes[gen_ai.GEN_AI_PROVIDER_NAME] == "openai"
        assert span.attributes[gen_ai.GEN_AI_REQUEST_MODEL] == "test-model"
        assert span.attributes[gen_ai.GEN_AI_RESPONSE_MODEL] == "test-model"
        assert span.attributes[gen_ai.GEN_AI_USAGE_INPUT_TOKENS] == usage["prompt_tokens"]
        assert span.attributes[gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS] == usage["completion_tokens"]
        assert span.attributes[gen_ai.GEN_AI_RESPONSE_FINISH_REASONS] == [
            turn.output["finish_reason"]
        ]
        assert span.attributes["server.address"] == "127.0.0.1"
    called = of_run(spans, run_id, "execute_tool ")
    assert sorted((s.attributes["agentflow.seq"], s.name) for s in called) == [
        (t.seq, f"execute_tool {t.name}") for t in tools
    ]
    assert {s.attributes[gen_ai.GEN_AI_TOOL_NAME] for s in called} == {t.name for t in tools}
    assert all(s.trace_id == run_trace for s in called)
    # The replay is visible as such: turn 3's step after the kill replayed turns 1 and 2.
    turn_3 = turns[2].seq
    retried = [
        s
        for s in spans
        if s.name == "step llm"
        and s.attributes.get("agentflow.run_id") == run_id
        and s.attributes.get("agentflow.seq") == turn_3
        and s.attributes.get("agentflow.attempt") == 2
    ]
    assert [s.attributes["agentflow.replayed_turns"] for s in retried] == [2]
