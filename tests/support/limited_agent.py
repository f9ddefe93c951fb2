"""An agent workflow whose one turn asks for two read-only lookups at once, each a call to a
partner that AGENTFLOW_PARTNER_LIMITS may limit (`lookups`): with a rate of one a second, the
second member of the batch gets no turn and waits, while the first is recorded.

`slow_batch_agent`: its first turn looks the stock up alone (taking the partner's turn), its
second asks at once for the price (which then waits for the next turn, at the batch's first
position) and `count_shelves`, a read that appends a line to the file `TEST_BATCH_COUNT` each
time it runs and then waits until the file `TEST_BATCH_GATE` exists.

Workers import it through `AGENTFLOW_WORKFLOW_MODULES`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from agentflow import durable
from agentflow.agent import (
    ModelRequest,
    ScriptedModel,
    Toolbox,
    ToolContext,
    answer,
    call,
    calls,
    system_message,
    tool_result_message,
    user_message,
)

PARTNER = "lookups"
toolbox = Toolbox("limited_agent")


@toolbox.tool("lookup_price", read_only=True, description="A product's price.")
def lookup_price(ctx: ToolContext, product: str) -> dict[str, Any]:
    with durable.partner_call(PARTNER, "price"):
        return {"product": product, "price_cents": 1200}


@toolbox.tool("lookup_stock", read_only=True, description="A product's stock.")
def lookup_stock(ctx: ToolContext, product: str) -> dict[str, Any]:
    with durable.partner_call(PARTNER, "stock"):
        return {"product": product, "in_stock": 3}


def plan(request: ModelRequest) -> Any:
    if request.turn == 1:
        return calls(call("lookup_price", product="kettle"), call("lookup_stock", product="kettle"))
    return answer("A kettle is $12.00; 3 in stock.")


agent = durable.CodeWorkflow(
    "limited_agent", version=1, toolbox=toolbox, model=ScriptedModel("scripted-shop", plan)
)


@agent.run
def price_and_stock(ctx: durable.AgentContext) -> str:
    messages = [system_message("You answer shop questions."), user_message("Kettle?")]
    while not (turn := ctx.llm(messages)).is_final:
        messages.append(turn.message)
        for tool_call in turn.tool_calls:
            messages.append(tool_result_message(tool_call.id, ctx.tool(tool_call).result))
    return turn.text


slow_toolbox = Toolbox("slow_batch_agent")
slow_toolbox.add(toolbox["lookup_price"])
slow_toolbox.add(toolbox["lookup_stock"])


@slow_toolbox.tool("count_shelves", read_only=True, description="How many shelves hold it.")
def count_shelves(ctx: ToolContext, product: str) -> dict[str, Any]:
    with Path(os.environ["TEST_BATCH_COUNT"]).open("a") as file:
        file.write(f"{ctx.idempotency_key}\n")
    gate = Path(os.environ["TEST_BATCH_GATE"])
    deadline = time.monotonic() + 120
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return {"product": product, "shelves": 2}


def slow_plan(request: ModelRequest) -> Any:
    if request.turn == 1:
        return calls(call("lookup_stock", product="kettle"))
    if request.turn == 2:
        return calls(
            call("lookup_price", product="kettle"), call("count_shelves", product="kettle")
        )
    return answer("A kettle is $12.00, on 2 shelves.")


slow_agent = durable.CodeWorkflow(
    "slow_batch_agent",
    version=1,
    toolbox=slow_toolbox,
    model=ScriptedModel("scripted-shop", slow_plan),
)


@slow_agent.run
def price_and_shelves(ctx: durable.AgentContext) -> str:
    return price_and_stock(ctx)
