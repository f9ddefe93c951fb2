"""The fee waiver, for both engines: what the policy puts before an operator, what the operator
is shown, and what their decision — or its timing out — means for the fee and for the customer.

A customer may ask, on the form, to have the change fee waived for one of the reasons the
policy considers (`refunds.policy.WAIVER_REASONS`). The refund then waits for an operator's
approval of exactly that waiver before the card or the seat is touched: the graph's
`request_fee_waiver` step and the agent's tool of the same name are declared
`requires_approval`. Approved, the fee is 0 and nothing is held on the card; rejected or timed
out, the normal fee is held and taken, and the customer is told why.

The step's recorded output is the one source of truth, read the same way by the fee, the
status page and the e-mails (never by which steps ran):
- the graph step, approved: `{"waived": True, "waiver_reason", "fee_cents", "note"}`;
- the graph step, rejected or timed out (the engine's): `{"approved": False, "actor",
  "reason", "timed_out"}`;
- the agent tool, rejected or timed out (the engine's, what the model reads): `{"rejected":
  True, "reason", "timed_out"}`;
- no waiver asked for (the graph step runs without waiting): `{"requested": False}`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from refunds import policy

if TYPE_CHECKING:  # the status page reads outcomes without a database
    from agentflow.durable import StepContext
    from refunds.models import RefundRequest

#: The persisted name of the graph step and of the agent's tool.
STEP = "request_fee_waiver"
NOT_REQUESTED: dict[str, Any] = {"requested": False}


def proposal(request: RefundRequest, fare_class: str) -> policy.WaiverProposal | None:
    """What the policy proposes for this request: None unless the customer asked for a waiver
    for a reason it considers and the fare has a fee to waive."""
    return policy.propose_waiver(reason=request.waiver_reason, fare_class=fare_class)


def proposal_output(found: policy.WaiverProposal | None) -> dict[str, Any] | None:
    """How the policy step records its proposal (None: nothing to put before an operator)."""
    if found is None:
        return None
    return {
        "reason": found.reason,
        "reason_words": found.reason_words,
        "fee_cents": found.fee_cents,
    }


def approval_arguments(request: RefundRequest, proposed: Mapping[str, Any]) -> dict[str, Any]:
    """What the operator approves (the decision is bound to exactly these): whose request, the
    fee at stake, the reason and the customer's own words about it."""
    return {
        "refund_id": request.public_id,
        "booking_reference": request.booking_reference.strip().upper(),
        "fee_cents": proposed["fee_cents"],
        "reason": proposed["reason"],
        "reason_words": proposed["reason_words"],
        "details": request.waiver_details,
    }


def granted_output(proposed: Mapping[str, Any], ctx: StepContext) -> dict[str, Any]:
    """The waiver step's output once approved: the fee it waives and the operator's words."""
    decision = getattr(ctx, "decision", None)
    return {
        "waived": True,
        "waiver_reason": proposed["reason"],
        "fee_cents": proposed["fee_cents"],
        "note": str(getattr(decision, "reason", "") or ""),
    }


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What became of a waiver that was asked for."""

    granted: bool
    #: Nobody decided within AGENTFLOW_APPROVAL_TIMEOUT: the normal fee applies.
    timed_out: bool = False
    #: The operator's words, told to the customer.
    note: str = ""

    @property
    def customer_line(self) -> str:
        """One sentence for the status page and the e-mails."""
        if self.granted:
            return "Fee waiver: approved by our team, so there is no change fee."
        if self.timed_out:
            return (
                "Fee waiver: our team couldn't review your request in time, so the standard "
                "change fee applies."
            )
        why = self.note.strip().rstrip(".")
        return (
            f"Fee waiver: our team couldn't waive the fee ({why}), so the standard change fee "
            "applies."
            if why
            else "Fee waiver: our team couldn't waive the fee, so the standard change fee applies."
        )


def outcome_of(output: Any) -> Outcome | None:
    """The waiver's outcome from its step's recorded output (see the module's docstring); None
    when no waiver was asked for or nothing is decided yet."""
    if not isinstance(output, Mapping):
        return None
    if output.get("waived") is True:
        return Outcome(granted=True, note=_text(output.get("note")))
    if output.get("approved") is False or output.get("rejected") is True:
        return Outcome(
            granted=False,
            timed_out=output.get("timed_out") is True,
            note=_text(output.get("reason")),
        )
    return None


def waived_cents(output: Any) -> int:
    """The fee the waiver takes off: the whole fee once approved, else 0."""
    outcome = outcome_of(output)
    if outcome is None or not outcome.granted:
        return 0
    value = output.get("fee_cents")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _text(value: Any) -> str:
    return value[:500] if isinstance(value, str) else ""
