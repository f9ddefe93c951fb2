"""A deploy for the divergence test, loaded by a worker through AGENTFLOW_WORKFLOW_MODULES: it
changes what the refund agent shows the model of a booking (the seat is hidden too) without
bumping the workflow's version, so a run recorded before it no longer replays at the turn that
first shows a booking."""

from __future__ import annotations

from refunds.agent import prompts

_before = prompts.shown_to_model


def _hiding_the_seat(tool: str, result: object) -> object:
    shown = _before(tool, result)
    if tool == "fetch_booking" and isinstance(shown, dict):
        return {key: value for key, value in shown.items() if key != "seat"}
    return shown


prompts.shown_to_model = _hiding_the_seat
