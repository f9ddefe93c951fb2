"""The fee waiver, for both engines: what the policy puts before an operator, what the operator
is shown, and what their decision — or its timing out — means for the fee and for the customer.

A customer may ask, on the form, to have the change fee waived for one of the reasons the
policy considers (`refunds.policy.WAIVER_REASONS`). The refund then waits for an operator's
approval of exactly that waiver before the card or the seat is touched: the graph's
`request_fee_waiver` step and the agent's tool of the same name are declared
`requires_approval`. Approved, the fee is 0 and nothing is held on the card; rejected or timed
out, the normal fee is held and taken, and the customer is told so.

What the customer tells us about it (`details`) is shown to whoever decides, in both engines
(the agent's call carries it beside the model's arguments: `tool_approval_arguments`), and is
declared sensitive: in the admin only those who decide waivers and those who may read refund
requests read it (`DETAILS`), and the status-page id that opens the customer's page, where the
customer reads it back, likewise (`STATUS_PAGE_KEY`). What the operator
tells the customer is apart from their reason: one of the policy's sentences, or words they
wrote in the admin's field for the customer and saw in a preview (`REPLIES`, the decision's
`reply`). Their reason and their name stay internal: nothing here reads them.

The step's recorded output is the one source of truth, read the same way by the fee, the
status page and the e-mails (never by which steps ran):
- the graph step, approved: `{"waived": True, "waiver_reason", "fee_cents", "reply"}`;
- the graph step, rejected or timed out (the engine's): `{"approved": False, "actor",
  "reason", "timed_out", "reply"}`;
- the agent tool, approved: its own result, as the graph step's;
- the agent tool, rejected or timed out (the engine's, what the model reads): `{"rejected":
  True, "reason", "timed_out", "reply"}`;
- no waiver asked for (the graph step runs without waiting): `{"requested": False}`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from django.utils.timesince import timeuntil

from agentflow import durable
from refunds import policy, wording
from refunds.models import RefundRequest

#: The persisted name of the graph step and of the agent's tool.
STEP = "request_fee_waiver"
NOT_REQUESTED: dict[str, Any] = {"requested": False}
#: The customer's own words about the waiver: read by deciders and by refund request readers.
DETAILS = durable.Sensitive("details", readers=["refunds.view_refundrequest"])
#: The refund's status-page id (a run's `refund_id` input, and its business key) opens the
#: customer's own page, which shows those words to whoever holds it, with no login: in the
#: admin it is read by the same people, and a link that carries it is shown to them alone.
STATUS_PAGE_KEY = durable.Sensitive("refund_id", readers=DETAILS.readers)
#: What a decision on it may tell the customer (the policy's sentences, or the operator's own).
REPLIES = durable.Replies(
    approve=policy.WAIVER_REPLIES["approve"], reject=policy.WAIVER_REPLIES["reject"]
)


def decided_within() -> str:
    """How long a customer may wait for our team, in words ("2 days"): the engine's approval
    timeout, after which the normal fee path runs; so the promise follows the setting."""
    now = timezone.now()
    return timeuntil(now + timedelta(seconds=float(settings.AGENTFLOW_APPROVAL_TIMEOUT)), now)


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


def tool_approval_arguments(ctx: durable.StepContext, call: Mapping[str, Any]) -> dict[str, Any]:
    """What the operator reads besides the agent's call (`refund_id`, `reason`): the booking,
    the reason the customer chose and their own words about it, from their request (the model is
    never shown those words)."""
    request = RefundRequest.objects.filter(public_id=(ctx.input or {}).get("refund_id")).first()
    if request is None:
        return {}
    return {
        "booking_reference": request.booking_reference.strip().upper(),
        "reason_words": policy.waiver_reason_words(request.waiver_reason),
        "details": request.waiver_details,
    }


# --- the graph's step -----------------------------------------------------------------------
def proposed_in(ctx: durable.StepContext) -> dict[str, Any]:
    """The waiver the policy step proposed ({} for none)."""
    return (ctx.output_of("check_cancellation_policy") or {}).get("fee_waiver") or {}


def needs_approval(ctx: durable.StepContext) -> bool:
    """`request_fee_waiver` waits for an operator's approval only when the policy proposed a
    waiver; otherwise it runs at once and records that none was asked for."""
    return bool(proposed_in(ctx))


def request_fee_waiver(ctx: durable.StepContext) -> dict[str, Any]:
    """The graph step: runs once an operator approved the proposed waiver (a rejection or a
    timeout records the engine's own output instead, and this does not run), or at once when
    none was proposed. Nothing is waived without an approving decision."""
    proposed = proposed_in(ctx)
    if not proposed:
        return dict(NOT_REQUESTED)
    if ctx.decision is None or not ctx.decision.approved:
        return {"approved": False, "actor": "", "reason": "", "timed_out": False}
    return granted_output(proposed, ctx.decision)


def granted_output(
    proposed: Mapping[str, Any], decision: durable.Decision | None
) -> dict[str, Any]:
    """The waiver's output once approved: the fee it waives and what the decision tells the
    customer (its reply; never its reason or who decided)."""
    return {
        "waived": True,
        "waiver_reason": proposed["reason"],
        "fee_cents": proposed["fee_cents"],
        "reply": decision.reply if decision is not None else "",
    }


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What became of a waiver that was asked for."""

    granted: bool
    #: Nobody decided within AGENTFLOW_APPROVAL_TIMEOUT: the normal fee applies.
    timed_out: bool = False
    #: What the decision tells the customer (a policy sentence or the operator's previewed
    #: words; "" for the policy's default).
    reply: str = ""

    @property
    def customer_line(self) -> str:
        """One sentence for the status page and the e-mails (refunds.wording)."""
        if self.timed_out:
            return wording.WAIVER_TIMED_OUT
        return wording.waiver_reply(self.reply, granted=self.granted)


def outcome_of(output: Any) -> Outcome | None:
    """The waiver's outcome from its step's recorded output (see the module's docstring); None
    when no waiver was asked for or nothing is decided yet. The operator's reason and name are
    in a rejection's output too: they are never read."""
    if not isinstance(output, Mapping):
        return None
    reply = _text(output.get("reply"))
    if output.get("waived") is True:
        return Outcome(granted=True, reply=reply)
    if output.get("approved") is False or output.get("rejected") is True:
        timed_out = output.get("timed_out") is True
        return Outcome(granted=False, timed_out=timed_out, reply="" if timed_out else reply)
    return None


def waived_cents(output: Any) -> int:
    """The fee the waiver takes off: the whole fee once approved, else 0."""
    outcome = outcome_of(output)
    if outcome is None or not outcome.granted:
        return 0
    value = output.get("fee_cents")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


# --- the e-mails ----------------------------------------------------------------------------
def recorded(ctx: durable.StepContext) -> Any:
    """The waiver step's recorded output. An agent run's rejected call did not run, so its
    tools' outputs leave it out: then the engine's `{"rejected": true, ...}` in its checkpoint."""
    found = ctx.output_of(STEP)
    if found is not None:
        return found
    for call in reversed(ctx.recorded_calls()):
        if call.name == STEP and isinstance(call.output, dict):
            return call.output.get("result")
    return None


def email_context(output: Any) -> dict[str, Any]:
    """What the e-mails say of a waiver asked for: granted, refused (in the words the decision
    chose for the customer) or not decided in time; nothing when none was asked for."""
    outcome = outcome_of(output)
    if outcome is None:
        return {"fee_waived": False, "waiver_line": ""}
    return {"fee_waived": outcome.granted, "waiver_line": outcome.customer_line}


def _text(value: Any) -> str:
    return value[: policy.WAIVER_REPLY_MAX_CHARS] if isinstance(value, str) else ""
