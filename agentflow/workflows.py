"""Built-in definitions: a demo workflow for `make run`, and the benchmark's no-op workflow."""

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


#: Ten no-op steps, alternating read and effect: what `manage.py bench` measures.
bench = durable.Workflow("bench", version=1)


def _noop(ctx: durable.StepContext) -> None:
    return None


for _index in range(10):
    bench.step(f"step_{_index}", kind="read" if _index % 2 == 0 else "effect")(_noop)
