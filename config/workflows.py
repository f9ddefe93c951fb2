"""The demo workflow `make run` starts (this site lists it in AGENTFLOW_WORKFLOW_MODULES)."""

from __future__ import annotations

from typing import Any

from agentflow import durable

demo = durable.Workflow("demo", version=1)


@demo.step("greet", kind="read")
def greet(ctx: durable.StepContext) -> dict[str, Any]:
    return {"greeting": f"hello, {ctx.input.get('name', 'world')}"}


@demo.step("pretend_effect", kind="effect")
def pretend_effect(ctx: durable.StepContext) -> dict[str, Any]:
    return {"key": ctx.idempotency_key}


@demo.step("summarise", kind="read")
def summarise(ctx: durable.StepContext) -> dict[str, Any]:
    return {"greeting": ctx.output_of("greet")["greeting"], "steps": len(ctx.outputs) + 1}
