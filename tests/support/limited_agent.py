"""An agent workflow whose one turn asks for two read-only lookups at once, each a call to a
partner that AGENTFLOW_PARTNER_LIMITS may limit (`lookups`): with a rate of one a second, the
second member of the batch gets no turn and waits, while the first is recorded.

Workers import it through `AGENTFLOW_WORKFLOW_MODULES`.
"""

from __future__ import annotations

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
