"""An agent workflow whose one turn asks for two read-only lookups at once, each a call to a
partner that AGENTFLOW_PARTNER_LIMITS may limit (`lookups`): with a rate of one a second, the
second member of the batch gets no turn and waits, while the first is recorded.

`slow_batch_agent`: its first turn looks the stock up alone (taking the partner's turn), its
second asks at once for the price (which then waits for the next turn, at the batch's first
position) and `count_shelves`, a read that appends a line to the file `TEST_BATCH_COUNT` each
time it runs and then waits until the file `TEST_BATCH_GATE` exists.

`troubled_batch_agent`: its one turn asks at once for `check_till` and the price (the price
first when the trouble is "database"); the user message (the run's input `trouble`) says how
the till check fails: "disagree" asks for a person (NeedsAttention), "database" has the
database fail a statement, "flaky" makes a call to the partner that fails, then asks again,
and (with a rate of one a minute) gets no turn.

Workers import it through `AGENTFLOW_WORKFLOW_MODULES`.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from django.db import OperationalError

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


troubled_toolbox = Toolbox("troubled_batch_agent")
troubled_toolbox.add(toolbox["lookup_price"])


@troubled_toolbox.tool("check_till", read_only=True, description="Whether the till agrees.")
def check_till(ctx: ToolContext, product: str, trouble: str) -> dict[str, Any]:
    if trouble == "disagree":
        raise durable.NeedsAttention("the till and the shelf disagree")
    if trouble == "database":
        raise OperationalError("server closed the connection unexpectedly")
    if trouble == "flaky":
        with contextlib.suppress(durable.PartnerUnavailable), durable.partner_call(PARTNER, "till"):
            raise durable.PartnerUnavailable("the till did not answer")
        with durable.partner_call(PARTNER, "till again"):
            pass
    return {"product": product, "agrees": True}


def troubled_plan(request: ModelRequest) -> Any:
    trouble = next(m["content"] for m in request.messages if m.get("role") == "user")
    if request.turn == 1:
        till = call("check_till", product="kettle", trouble=trouble)
        price = call("lookup_price", product="kettle")
        return calls(price, till) if trouble == "database" else calls(till, price)
    return answer("The till agrees: a kettle is $12.00.")


troubled_agent = durable.CodeWorkflow(
    "troubled_batch_agent",
    version=1,
    toolbox=troubled_toolbox,
    model=ScriptedModel("scripted-shop", troubled_plan),
)


@troubled_agent.run
def till_and_price(ctx: durable.AgentContext) -> str:
    messages = [system_message("You answer shop questions."), user_message(ctx.input["trouble"])]
    while not (turn := ctx.llm(messages)).is_final:
        messages.append(turn.message)
        for tool_call in turn.tool_calls:
            messages.append(tool_result_message(tool_call.id, ctx.tool(tool_call).result))
    return turn.text
