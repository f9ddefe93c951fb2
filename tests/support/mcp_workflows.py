"""An agent workflow whose tools an MCP server serves (`tests/support/mcp_server.py`).

Workers import it through `AGENTFLOW_WORKFLOW_MODULES`; the server's ledger is the file named
by `TEST_MCP_LEDGER`, read when the server is started, so a test aims it per worker; with
`TEST_MCP_GATE`, the server dies at start until that file exists; with `TEST_MCP_FAULT` (`exit`
or `hang`), `add_note` applies the note and then gives no answer, with `lookup_fails` its
lookup answers an error (see mcp_server); and
`TEST_MCP_TIMEOUT` is how long the host waits for one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from agentflow import durable
from agentflow.agent import (
    ModelRequest,
    ScriptedModel,
    Toolbox,
    answer,
    call,
    calls,
    system_message,
    tool_result_message,
    user_message,
)
from agentflow.agent.mcp_tools import StdioServer

SERVER_SCRIPT = Path(__file__).with_name("mcp_server.py")
#: How the server is started: `-P` keeps the script's folder off `sys.path`, so that no module
#: of `tests/support` can shadow one the server imports (a `calendar.py` there once shadowed the
#: standard library's, which `email`, so pydantic, imports, and the server died before it was
#: listed; `tests/support/refunds.py` would shadow the project's `refunds`).
SERVER_ARGS = ["-P", str(SERVER_SCRIPT)]


#: The ledger is the worker's: its environment is the test's when it starts.
orders = StdioServer(
    "orders",
    command=sys.executable,
    args=[
        *SERVER_ARGS,
        os.environ.get("TEST_MCP_LEDGER", os.devnull),
        os.environ.get("TEST_MCP_GATE", ""),  # a file the server waits for: see mcp_server
        os.environ.get("TEST_MCP_FAULT", ""),
    ],
    timeout_seconds=float(os.environ.get("TEST_MCP_TIMEOUT", "60")),
)
toolbox = Toolbox("mcp_agent")
toolbox.add(orders.tool("lookup_order", read_only=True))
# The server annotates it read-only; the host says what it does, and how a lost answer is
# learnt (TEST_MCP_NOTE): the server keys it by the call's key ("idempotent", the default), a
# lookup tool finds it ("reconcile"), or neither ("none": the run parks "outcome unknown").
_NOTE = os.environ.get("TEST_MCP_NOTE", "idempotent")
toolbox.add(
    orders.tool(
        "add_note",
        side_effect=True,
        idempotent=_NOTE == "idempotent",
        reconcile="find_note" if _NOTE == "reconcile" else None,
    )
)
# `drop_orders` is listed by the server and declared by nobody: never offered.


def plan(request: ModelRequest) -> Any:
    """Turn 1: look the order up (and try the undeclared tool); turn 2: add a note."""
    if request.turn == 1:
        return calls(call("lookup_order", order="A1"), call("drop_orders"))
    if request.turn == 2:
        return calls(call("add_note", order="A1", note="kettle shipped"))
    return answer("Noted.")


def noted(history: Any) -> str | None:
    return None if any(r.ok and r.name == "add_note" for r in history) else "no note was added"


agent = durable.CodeWorkflow(
    "mcp_agent",
    version=1,
    toolbox=toolbox,
    model=ScriptedModel("scripted-clerk", plan),
    done=noted,
)


@agent.run
def note_the_order(ctx: durable.AgentContext) -> str:
    messages = [system_message("You keep order notes."), user_message("Note order A1.")]
    while not (turn := ctx.llm(messages)).is_final:
        messages.append(turn.message)
        for tool_call in turn.tool_calls:
            messages.append(tool_result_message(tool_call.id, ctx.tool(tool_call).result))
    return turn.text
