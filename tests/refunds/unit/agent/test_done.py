"""The refund agent's "done": what its recorded calls must show before a final answer counts."""

from __future__ import annotations

from typing import Any

from agentflow.agent import ToolRecord
from refunds.agent.workflow import fee_secured_once, rebooked, refund_agent


def ran(name: str, result: Any = None, *, ok: bool = True) -> ToolRecord:
    return ToolRecord(position=0, name=name, arguments={}, result=result or {}, ok=ok)


HELD = ran("charge_customer", {"authorized": True, "amount_cents": 4500})
REBOOKED = (
    ran("cancel_seat"),
    HELD,
    ran("issue_boarding_pass"),
    ran("update_crm"),
    ran("send_confirmation_email"),
)


def test_done__seat_fee_pass_and_confirmation_once_each() -> None:
    assert rebooked(REBOOKED) is None
    free = ran("charge_customer", {"authorized": False, "amount_cents": 0})  # a flex fare
    assert rebooked((REBOOKED[0], free, *REBOOKED[2:])) is None


def test_done__an_answer_after_one_lookup_did_nothing() -> None:
    assert rebooked([ran("load_request")]) == (
        "We couldn't finish changing your booking: your seat was not changed; the change fee "
        "was not settled; no new boarding pass was issued; no confirmation was sent."
    )


def test_done__refused_calls_count_for_nothing() -> None:
    refused = ran("issue_boarding_pass", {"error": "refused"}, ok=False)
    assert rebooked((*REBOOKED[:2], refused, *REBOOKED[3:])) == (
        "We couldn't finish changing your booking: no new boarding pass was issued."
    )


def test_fee_secured_once__one_charge_that_held_the_fee_or_said_none_was_due() -> None:
    assert fee_secured_once([HELD])
    assert not fee_secured_once([])
    assert not fee_secured_once([HELD, HELD])
    unheld = ran("charge_customer", {"authorized": False, "amount_cents": 4500})
    assert not fee_secured_once([unheld])


def test_outputs_view__a_refused_call_after_one_that_ran_does_not_hide_it() -> None:
    """Three boarding passes asked in a turn: the second and third refused (max_calls) used to
    hide the first from `capture_fee`, which then failed a finished change."""
    issued = {"ok": True, "result": {"barcode": "M1"}}
    refused = {"ok": False, "result": {"error": "limit_reached"}}
    view = refund_agent.outputs_view(
        [("issue_boarding_pass", issued), ("issue_boarding_pass", refused)]
    )
    assert view["issue_boarding_pass"] == {"barcode": "M1"}
