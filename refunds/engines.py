"""Which engine handles a refund — the graph workflow, or the same refund as an agent run
(`REFUNDS_ENGINE=agent`) — and how either run reads on the customer's status page."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from django.conf import settings

from agentflow import durable
from refunds import waivers

GRAPH = "refund"
AGENT = "refund_agent"
#: What the customer sees of an agent run: its tool calls, in the order a refund takes them
#: (model turns and the owner check in code are the engine's business).
AGENT_STEPS = (
    "load_request",
    "fetch_booking",
    "check_cancellation_policy",
    waivers.STEP,
    "charge_customer",
    "cancel_seat",
    "issue_boarding_pass",
    "update_crm",
    "send_confirmation_email",
    "capture_fee",
)
#: Its compensations, shown once they start (named after the call they undo: `refund_fee@7`).
AGENT_COMPENSATIONS = ("refund_fee", "reinstate_seat", "notify_failure")
_UNDO_SUFFIX = "@"


def workflow_name() -> str:
    """The workflow new refunds start: `REFUNDS_ENGINE` (graph, the default, or agent)."""
    return AGENT if settings.REFUNDS_ENGINE == "agent" else GRAPH


def planned(run: durable.RunSnapshot | None, *, waiver_asked: bool = False) -> list[str]:
    """The rows the status page lists before they happen; the fee waiver's only when the
    customer asked for one."""
    if run is not None and run.workflow == AGENT:
        rows = list(AGENT_STEPS)
    else:
        rows = durable.workflow_steps(GRAPH)
    return rows if waiver_asked else [name for name in rows if name != waivers.STEP]


def customer_steps(
    run: durable.RunSnapshot, *, waiver_asked: bool = False
) -> list[durable.StepSnapshot]:
    """The run's steps as the status page names them: an agent run's tool calls and its
    compensations by their tool's name, with the tool's result as the output. A call that was
    refused (unknown, invalid, over a limit) did nothing, so it is not shown as a step done;
    nor is the graph's fee waiver step when no waiver was asked for (it waited for no one)."""
    if run.workflow != AGENT:
        if waiver_asked:
            return list(run.steps)
        return [step for step in run.steps if step.output != waivers.NOT_REQUESTED]
    shown = []
    for step in run.steps:
        name = step.name.split(_UNDO_SUFFIX, 1)[0]
        if name not in (*AGENT_STEPS, *AGENT_COMPENSATIONS) or _refused(step):
            continue
        shown.append(_as_graph_step(step, name))
    return shown


def outputs(steps: Sequence[durable.StepSnapshot]) -> dict[str, dict[str, Any]]:
    """Completed steps' outputs by name (the latest of a name wins)."""
    return {
        step.name: step.output
        for step in steps
        if step.status == durable.StepStatus.COMPLETED and isinstance(step.output, dict)
    }


def _refused(step: durable.StepSnapshot) -> bool:
    output = step.output
    return (
        isinstance(output, dict)
        and output.get("ok") is False
        and "result" in output
        and not _rejected(output)
    )


def _rejected(output: dict[str, Any]) -> bool:
    """A call our team rejected (or left undecided until it timed out): it did not run, but the
    decision is the customer's to read, so it is shown, its answer as its output."""
    result = output.get("result")
    return isinstance(result, dict) and result.get("rejected") is True


def _as_graph_step(step: durable.StepSnapshot, name: str) -> durable.StepSnapshot:
    output = step.output
    if isinstance(output, dict) and "ok" in output and "result" in output:
        output = output["result"] if output["ok"] or _rejected(output) else None
    return replace(step, name=name, output=output)
