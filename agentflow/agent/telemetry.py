"""Agent mode's observation points (the engine's own are `agentflow._observe.telemetry`): a
run's model tokens and dollars, spent and saved, and the spans of its new model turns and tool
calls, in OpenTelemetry's GenAI conventions."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from typing import Any

from agentflow._base.context import StepContext
from agentflow._conf import settings
from agentflow._core.registry import StepDef
from agentflow._observe import metrics, tracing
from agentflow.agent import pricing
from agentflow.agent.conversation import OPENAI_PROVIDER, ModelResponse
from agentflow.agent.fingerprint import CallKind

#: The GenAI provider name of a workflow's own offline model (a scripted planner).
OFFLINE_PROVIDER = "agentflow.scripted"


def model_tokens(*, workflow: Any, spent: int = 0, saved: int = 0) -> None:
    """An agent run's model tokens: `spent` on a turn just asked, `saved` on the turns a
    replay handed back from checkpoints instead of asking again."""
    metrics.model_tokens(workflow=workflow.name, model=_model(workflow), spent=spent, saved=saved)


def model_turn_recorded(*, workflow: Any, output: Any) -> None:
    """A model turn was just asked and recorded: its tokens, and its dollars by the model
    that answered (or that it has no price)."""
    tokens = output.get("usage", {}).get("total_tokens") if isinstance(output, dict) else None
    if isinstance(tokens, int) and tokens > 0:
        model_tokens(workflow=workflow, spent=tokens)
    answered = output.get("model") if isinstance(output, dict) else None
    metrics.model_cost_spent(
        workflow=workflow.name,
        model=str(answered or _model(workflow)),
        cost=pricing.recorded(output),
    )


def model_cost_saved(*, workflow: Any, saved: Decimal) -> None:
    """The recorded dollars of the priced turns a replay handed back instead of asking."""
    metrics.model_cost_saved(workflow=workflow.name, model=_model(workflow), saved=saved)


def _model(workflow: Any) -> str:
    model = getattr(getattr(workflow, "model", None), "model", "") or "unknown"
    if settings.AGENTFLOW_LLM_BASE_URL:
        model = settings.AGENTFLOW_LLM_MODEL or model
    return str(model)


def traced_agent_call(step: StepDef) -> StepDef:
    """An agent run's new model turn or tool call, wrapped so that the request itself is a span
    under the step's (OpenTelemetry's GenAI conventions: `chat <model>`, `execute_tool
    <name>`). A call replayed from its checkpoint never gets here, so it makes no span; nor
    does one adopted from a superseded branch (nothing is asked). Unchanged with tracing off."""
    recorded = step.arguments if isinstance(step.arguments, dict) else {}
    if not tracing.enabled() or "reused" in recorded:
        return step
    fn = step.fn
    kind = recorded.get("kind")
    if kind == CallKind.LLM:
        asked = recorded.get("arguments")
        model = str(asked.get("model") or "") if isinstance(asked, dict) else ""

        def asked_model(ctx: StepContext) -> Any:
            server = settings.AGENTFLOW_LLM_BASE_URL
            with tracing.model_request_span(
                request_model=model,
                provider=OPENAI_PROVIDER if server else OFFLINE_PROVIDER,
                server=server,
                max_tokens=None,
                run_id=ctx.run_id,
                seq=ctx.seq,
            ) as span:
                output = fn(ctx)
                _answered(span, output)
            return output

        return replace(step, fn=asked_model)
    if kind == CallKind.TOOL:
        call_id = recorded.get("call_id")

        def called_tool(ctx: StepContext) -> Any:
            with tracing.tool_call_span(
                tool=step.name, call_id=call_id, run_id=ctx.run_id, seq=ctx.seq
            ) as span:
                output = fn(ctx)
                if isinstance(output, dict) and output.get("ok") is False:
                    span.set_attribute(tracing.ATTRIBUTE_PREFIX + "refused", True)
            return output

        return replace(step, fn=called_tool)
    return step


def _answered(span: Any, output: Any) -> None:
    if not isinstance(output, dict):
        return
    response = ModelResponse.from_json(output)
    tracing.model_answered(
        span,
        response_model=response.model,
        finish_reason=response.finish_reason,
        input_tokens=response.usage.prompt_tokens,
        output_tokens=response.usage.completion_tokens,
        provider=response.provider,
        server=response.server,
        # As Pydantic AI's spans carry it (from the same price table); absent when unknown.
        cost_usd=_float(pricing.recorded(output)),
    )


def _float(value: Decimal | None) -> float | None:
    return None if value is None else float(value)
