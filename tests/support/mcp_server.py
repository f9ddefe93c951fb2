"""A stdio MCP server (the official SDK's `MCPServer`) that the MCP agent tests' workers start.

    python tests/support/mcp_server.py LEDGER [GATE] [FAULT]

`lookup_order` reads; `add_note` is an effect that writes every call it receives to the
JSON-lines file LEDGER (its arguments and the idempotency key its `_meta` carried) and applies
it once per key: a repeat under a key it has seen answers what the first call did, as a
partner that honours idempotency keys does. Its annotations claim it only reads, which must
not make it read-only. `drop_orders` is listed but never declared by the host, so never offered.
FAULT, when given, is what `add_note` does once it has applied a note the first time under a
key, instead of answering: `exit` (the server goes away mid-call) or `hang` (it never answers);
`lookup_fails` makes `find_note` answer with an error instead.
The server imports nothing of this repository: it runs as the SDK starts it, with the SDK's
bare environment.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

#: Where the tests find the key in a call's `_meta` (agentflow.agent.mcp_tools's).
KEY = "agentflow/idempotency_key"
ORDERS = {"A1": {"order": "A1", "item": "kettle", "status": "shipped"}}

app = MCPServer("orders")


def calls(ledger: Path) -> list[dict[str, Any]]:
    """Every `add_note` call the server received, in order."""
    if not ledger.exists():
        return []
    return [json.loads(line) for line in ledger.read_text().splitlines() if line]


@app.tool(description="An order's item and status.")
def lookup_order(order: str) -> dict[str, Any]:
    return ORDERS.get(order, {"order": order, "status": "unknown"})


@app.tool(
    description="Add a note to an order.",
    annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False),
)
def add_note(order: str, note: str, ctx: Context) -> dict[str, Any]:
    key = (ctx.request_context.meta or {}).get(KEY)
    ledger = Path(sys.argv[1])
    with ledger.open("a+") as file:
        fcntl.flock(file, fcntl.LOCK_EX)  # two pool processes may call at once
        seen = calls(ledger)
        first = next((c for c in seen if key and c["key"] == key), None)
        record = {"key": key, "order": order, "note": note, "applied": first is None}
        file.write(json.dumps(record) + "\n")
        file.flush()
    fault = sys.argv[3] if len(sys.argv) > 3 else ""
    if fault in ("exit", "hang") and record["applied"]:
        if fault == "exit":
            os._exit(1)  # applied, and the answer never goes
        time.sleep(3600)  # "hang": applied, and the server never answers
    return {"order": order, "note": note, "key": key}


@app.tool(description="The note added under an idempotency key, if any (add_note's reconcile).")
def find_note(idempotency_key: str) -> dict[str, Any]:
    if sys.argv[3:4] == ["lookup_fails"]:
        raise ToolError("the notes index is being rebuilt")
    found = next(
        (c for c in calls(Path(sys.argv[1])) if c["key"] == idempotency_key and c["applied"]),
        None,
    )
    if found is None:
        return {}
    return {"order": found["order"], "note": found["note"], "key": found["key"]}


@app.tool(description="Delete every order.")
def drop_orders() -> str:
    raise ToolError("refused: this server never drops orders")


if __name__ == "__main__":
    # `GATE`, when given: the server dies at once until that file exists (not started yet).
    if len(sys.argv) > 2 and sys.argv[2] and not Path(sys.argv[2]).exists():
        sys.exit("not ready")
    app.run("stdio")
