"""MCP tools through the official `mcp` SDK against the real stdio test server
(tests/support/mcp_server.py): the host's declarations, the server's schema, checks before a
call, and the key in `_meta`. No database: the durable side is the acceptance test's
(tests/agentflow/acceptance/test_mcp_tools.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentflow._base.states import StepKind
from agentflow.agent import Toolbox, ToolContext
from agentflow.agent.mcp_tools import MCPUnavailable, StdioServer
from agentflow.exceptions import DefinitionError
from tests.support import mcp_server
from tests.support.mcp_workflows import SERVER_ARGS


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return tmp_path / "ledger.jsonl"


@pytest.fixture
def orders(ledger: Path) -> StdioServer:
    return StdioServer("orders", command=sys.executable, args=[*SERVER_ARGS, str(ledger)])


def context(key: str = "wf_abc_step_5") -> ToolContext:
    return ToolContext(
        run_id="wf_abc",
        workflow="mcp",
        position=5,
        tool="t",
        attempt=1,
        idempotency_key=key,
        input={},
    )


@pytest.mark.parametrize("said", [{}, {"read_only": True, "side_effect": True}])
def test_declaration__exactly_one_of_read_only_or_side_effect(
    orders: StdioServer, said: dict[str, bool]
) -> None:
    with pytest.raises(DefinitionError, match="exactly one of read_only=True or side_effect"):
        orders.tool("add_note", **said)


def test_model_sees_only_declared_tools__with_the_servers_schema(orders: StdioServer) -> None:
    box = Toolbox("mcp_unit")
    box.add(orders.tool("lookup_order", read_only=True, description="Find an order."))
    box.add(orders.tool("add_note", side_effect=True))

    shown = {t["function"]["name"]: t["function"] for t in box.openai_tools()}

    assert list(shown) == ["lookup_order", "add_note"]  # drop_orders is listed, not declared
    assert shown["lookup_order"]["description"] == "Find an order."  # the host's words
    assert shown["add_note"]["description"] == "Add a note to an order."  # the server's
    assert shown["add_note"]["parameters"]["required"] == ["order", "note"]
    assert box["add_note"].step_kind == StepKind.EFFECT  # whatever readOnlyHint says
    assert box["add_note"].max_calls == 1  # a side effect's default, as a local tool's


def test_call__carries_the_steps_key_in_meta(orders: StdioServer, ledger: Path) -> None:
    box = Toolbox("mcp_unit")
    box.add(orders.tool("add_note", side_effect=True))

    outcome = box.prepare("add_note", {"order": "A1", "note": "hi"}).run(context("k-7"))

    assert outcome.ok
    assert outcome.result == {"order": "A1", "note": "hi", "key": "k-7"}
    assert mcp_server.calls(ledger) == [
        {"key": "k-7", "order": "A1", "note": "hi", "applied": True}
    ]


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"order": "A1"}, "'note' is a required property"),
        ({"order": "A1", "note": 3}, "3 is not of type 'string'"),
        ({"order": "A1", "note": "x", "urgent": True}, "Extra inputs are not permitted"),
    ],
)
def test_invalid_arguments__refused_before_any_call(
    orders: StdioServer, ledger: Path, arguments: dict, problem: str
) -> None:
    box = Toolbox("mcp_unit")
    box.add(orders.tool("add_note", side_effect=True))

    prepared = box.prepare("add_note", arguments)

    assert prepared.kind == StepKind.READ  # refused: nothing is claimed
    assert prepared.refused is not None
    assert prepared.refused.result["error"] == "invalid_arguments"
    assert problem in prepared.refused.result["message"]
    assert mcp_server.calls(ledger) == []


def test_server_error__the_model_reads_it_as_a_refusal(orders: StdioServer) -> None:
    box = Toolbox("mcp_unit")
    box.add(orders.tool("drop_orders", read_only=True))

    outcome = box.prepare("drop_orders", {}).run(context())

    assert not outcome.ok
    assert outcome.result["error"] == "refused"
    assert outcome.result["message"] == (
        "drop_orders did not run: Error executing tool drop_orders: refused: this server "
        "never drops orders"
    )


def test_a_declared_tool_the_server_does_not_list__named(orders: StdioServer) -> None:
    box = Toolbox("mcp_unit")
    box.add(orders.tool("refund_order", side_effect=True))

    with pytest.raises(DefinitionError, match="lists no tool 'refund_order'"):
        box.openai_tools()


def test_without_the_sdk__says_what_to_install(
    orders: StdioServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "mcp.client.stdio", None)

    with pytest.raises(MCPUnavailable, match=r"pip install 'django-agentflow\[mcp\]'"):
        orders.listed("add_note")
