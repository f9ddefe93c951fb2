"""Customer words for a refund run's progress: engine statuses in, plain sentences out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any, Protocol

from agentflow import durable
from agentflow.durable import RunStatus, StepStatus
from refunds import waivers

#: The standard fare's change fee (SPEC §5), shown until the run has worked out the real one.
DEFAULT_FEE_CENTS = 4500

#: Labels for every persisted step name; `{fee}` becomes the amount, e.g. "$45".
STEP_LABELS: Mapping[str, str] = {
    "load_request": "Receiving your request",
    "parse_flight_details": "Reading your request",
    "fetch_booking": "Finding your booking and checking your details",
    "check_flight": "Checking your new flight in the airline's schedule",
    "check_cancellation_policy": "Checking the fare rules",
    "request_fee_waiver": "Our team reviewing your fee waiver request",
    "calculate_penalty_fee": "Working out the fee",
    "charge_customer": "Securing the {fee} change fee on your card",
    "cancel_seat": "Releasing your seat",
    "issue_boarding_pass": "Issuing your new boarding pass",
    "capture_fee": "Taking the {fee} change fee",
    "update_crm": "Updating your file",
    "send_confirmation_email": "Emailing your confirmation",
    # Compensation: only shown once they start.
    "refund_fee": "Giving back the {fee} fee",
    "reinstate_seat": "Giving your seat back",
    "notify_failure": "Letting you know",
}
#: Fares that change for free (flex) have nothing to charge or refund.
NO_FEE_LABELS: Mapping[str, str] = {
    "request_fee_waiver": "No change fee to waive for your fare",
    "charge_customer": "No change fee for your fare",
    "capture_fee": "No change fee to take",
    "refund_fee": "No fee to give back",
}
#: A fee our team waived (refunds.waivers) has nothing to hold, take or give back either.
WAIVED_LABELS: Mapping[str, str] = {
    "charge_customer": "Change fee waived: nothing held on your card",
    "capture_fee": "Change fee waived: nothing to take",
    "refund_fee": "No fee to give back",
}
#: A step added later without a label must not show its internal name to customers.
GENERIC_LABEL = "Working on your request"


CHARGE_STEP = "charge_customer"
REFUND_STEP = "refund_fee"


class StepLike(Protocol):
    """What `durable.StepSnapshot` offers; tests pass plain stand-ins."""

    @property
    def seq(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def retryable(self) -> bool: ...


@dataclass(frozen=True, kw_only=True)
class StepView:
    name: str
    label: str
    #: One of STATE_LABELS' keys; the CSS and the script key their look on it.
    state: str
    state_label: str


#: Row states, in customer words.
STATE_LABELS: Mapping[str, str] = {
    "done": "Done",
    "active": "In progress",
    "retrying": "Taking longer than usual, still trying",
    "failed": "Could not be completed",
    "pending": "Waiting",
    "awaiting": "Waiting for our team",
    "held": "On hold for our team",
    "skipped": "Not done",
}


@dataclass(frozen=True, kw_only=True)
class Progress:
    #: working, awaiting_approval, completed, refunded, failed, needs_attention, cancelled,
    #: archived.
    outcome: str
    headline: str
    message: str
    #: True once nothing will change without a human: the page stops polling (it keeps
    #: polling while a fee waiver waits for our team: their decision moves the run on).
    final: bool
    steps: tuple[StepView, ...]
    #: Once final: what changed, or what did not, one plain sentence each.
    details: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "headline": self.headline,
            "message": self.message,
            "final": self.final,
            "details": list(self.details),
            "steps": [
                {
                    "name": s.name,
                    "label": s.label,
                    "state": s.state,
                    "state_label": s.state_label,
                }
                for s in self.steps
            ],
        }


def format_fee(cents: int) -> str:
    """'$45' for whole dollars, '$45.50' otherwise."""
    dollars, rest = divmod(cents, 100)
    return f"${dollars}" if rest == 0 else f"${dollars}.{rest:02d}"


def step_label(name: str, *, fee_cents: int = DEFAULT_FEE_CENTS, waived: bool = False) -> str:
    if waived:  # the fee was 0 because our team waived it, not because the fare is free
        return WAIVED_LABELS.get(name) or STEP_LABELS.get(name, GENERIC_LABEL).format(
            fee=format_fee(fee_cents)
        )
    if fee_cents <= 0 and name in NO_FEE_LABELS:
        return NO_FEE_LABELS[name]
    return STEP_LABELS.get(name, GENERIC_LABEL).format(fee=format_fee(fee_cents))


def describe(
    *,
    status: str,
    current_step: str,
    steps: Sequence[StepLike],
    planned: Sequence[str],
    fee_cents: int | None = None,
    reason: str = "",
    emailed: bool = False,
    details: Sequence[str] = (),
    outputs: Mapping[str, Mapping[str, Any]] | None = None,
    awaiting_approval: str = "",
) -> Progress:
    """Turn a run's status and checkpoints into what the status page says.

    `planned` is the workflow's forward path, so steps not reached yet still show as rows;
    compensation steps appear only once they have a checkpoint. `fee_cents` is the fee the
    run worked out (None until it has); `reason` a failure explanation already written for
    customers, shown when the change could not be made; `emailed` whether the customer was
    written to about it; `details` what changed (see `outcome_details`), shown once final;
    `outputs` the completed steps' outputs, which say what happened to the money (and to a fee
    waiver); `awaiting_approval` the step the run waits on an operator's approval for, if any
    (`durable.snapshot(...).waiting_for == "approval"`).
    """
    waiver = waivers.outcome_of((outputs or {}).get(waivers.STEP))
    waived = waiver is not None and waiver.granted
    fee = DEFAULT_FEE_CENTS if fee_cents is None else fee_cents
    latest = _latest_by_name(steps)
    # An active run whose current step is off the forward path is running compensations.
    undoing = not _is_finished(status) and bool(current_step) and current_step not in planned
    awaiting = "" if _is_finished(status) else awaiting_approval
    rows = [
        _row(name, latest.get(name), status=status, current_step=current_step,
             stopped=undoing or _is_finished(status), fee=fee, waived=waived, awaiting=awaiting)
        for name in planned
    ]  # fmt: skip
    extra = sorted(
        (cp for name, cp in latest.items() if name not in planned), key=lambda cp: cp.seq
    )
    rows += [
        _row(cp.name, cp, status=status, current_step=current_step, stopped=False, fee=fee,
             waived=waived, awaiting=awaiting)
        for cp in extra
    ]  # fmt: skip
    money = Money.of(outputs or {})
    outcome, headline, message = _summary(
        status, latest, money, undoing=undoing, fee=fee, emailed=emailed, awaiting=awaiting
    )
    if reason and outcome in ("failed", "refunded"):
        message = f"{reason.strip()} {message}"
    final = outcome not in ("working", "awaiting_approval")
    return Progress(
        outcome=outcome,
        headline=headline,
        message=message,
        final=final,
        steps=tuple(rows),
        details=tuple(details) if final and outcome != "needs_attention" else (),
    )


def date_in_words(iso: str) -> str:
    """'2027-03-16' -> 'Tuesday 16 March 2027'; anything else unchanged."""
    try:
        day = date.fromisoformat(iso)
    except (TypeError, ValueError):
        return str(iso or "")
    return f"{day:%A} {day.day} {day:%B %Y}"


@dataclass(frozen=True, kw_only=True)
class Money:
    """What happened to the fee, read from the recorded outputs (never from step names)."""

    cents: int = 0
    #: Held on the card (`charge_customer`), taken (`capture_fee`), given back (`refund_fee`).
    held: bool = False
    taken: bool = False
    refunded: bool = False
    released: bool = False

    @classmethod
    def of(cls, outputs: Mapping[str, Mapping[str, Any]]) -> Money:
        hold = outputs.get("charge_customer") or {}
        capture = outputs.get("capture_fee") or {}
        back = outputs.get("refund_fee") or {}
        return cls(
            cents=int(hold.get("amount_cents") or 0),
            held=bool(hold.get("authorized")),
            taken=bool(capture.get("captured")),
            refunded=bool(back.get("refunded")),
            released=bool(back.get("hold_released")),
        )

    @property
    def unsettled(self) -> bool:
        """Money taken and not refunded, or a hold neither taken nor released."""
        if self.taken:
            return not self.refunded
        return self.held and not (self.released or self.refunded)


def outcome_details(status: str, outputs: Mapping[str, Mapping[str, Any]]) -> tuple[str, ...]:
    """What a finished run changed, or did not, from its completed steps' outputs.

    Nothing is said about a booking the request was not found to own (`fetch_booking` did not
    complete): its flight and seat are the owner's business, not the sender's.
    """
    booking = outputs.get("fetch_booking") or {}
    money = Money.of(outputs)
    fee = format_fee(money.cents)
    waiver = waivers.outcome_of(outputs.get(waivers.STEP))
    if status == RunStatus.COMPLETED:
        issued = outputs.get("issue_boarding_pass") or {}
        if money.taken:
            charged = f"Change fee: {fee}, charged to your card"
        elif waiver is not None and waiver.granted:
            charged = "Change fee: none, our team waived it"
        else:
            charged = "Change fee: none for your fare"
        lines = [
            f"New flight: {issued.get('flight', '')} on {date_in_words(issued.get('date', ''))}",
            f"New seat: {issued.get('seat', '')}",
            charged,
        ]
        if waiver is not None:
            lines.append(waiver.customer_line)
        if outputs.get("send_confirmation_email"):
            lines.append("Confirmation and boarding pass emailed to the address on your booking")
        return tuple(lines)
    if status not in (RunStatus.FAILED, RunStatus.CANCELLED):
        return ()
    if not booking:
        return (
            "Nothing was changed: no booking was touched.",
            "No email was sent about this request.",
        )
    released = outputs.get("cancel_seat") or {}
    old = f"{booking.get('flight', '')} on {date_in_words(booking.get('date', ''))}"
    if released and (outputs.get("reinstate_seat") or {}).get("reinstated"):
        lines = [
            f"Your seat {released.get('seat', '')} on {old} was released during the change and "
            "has been given back to you: your booking is as it was."
        ]
    elif released:
        lines = [f"Your original seat {released.get('seat', '')} on {old} was released."]
    else:
        lines = [f"Your booking was not changed: still {old}, seat {booking.get('seat', '')}."]
    if waiver is not None:
        lines.append(waiver.customer_line)
    if money.refunded:
        lines.append(f"The {fee} change fee was refunded to your card.")
    elif money.released:
        lines.append(
            f"The {fee} change fee was only held on your card, and the hold was released: "
            "you have not been charged."
        )
    if (outputs.get("notify_failure") or {}).get("sent"):
        lines.append("We've emailed the details to the address on your booking.")
    return tuple(lines)


def archived() -> Progress:
    """A request whose run retention deleted (SPEC §3.8). Only finished runs are deleted, so it
    is over; which way it ended went to the customer by e-mail at the time, and is not kept."""
    return Progress(
        outcome="archived",
        headline="This request is closed",
        message="It was finished a while ago, so its step-by-step progress is no longer kept. "
        "The e-mail we sent you then has the outcome; contact us if you need anything else.",
        final=True,
        steps=(),
    )


def _latest_by_name(steps: Sequence[StepLike]) -> dict[str, StepLike]:
    latest: dict[str, StepLike] = {}
    for cp in sorted(steps, key=lambda cp: cp.seq):
        latest[cp.name] = cp
    return latest


def _is_finished(status: str) -> bool:
    """Finished or parked: the run will not move by itself."""
    return status not in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING)


def _row(
    name: str,
    cp: StepLike | None,
    *,
    status: str,
    current_step: str,
    stopped: bool,
    fee: int,
    waived: bool,
    awaiting: str,
) -> StepView:
    if name == awaiting and (cp is None or cp.status != StepStatus.COMPLETED):
        state = "awaiting"
    else:
        state = _row_state(name, cp, status, current_step, stopped)
    return StepView(
        name=name,
        label=step_label(name, fee_cents=fee, waived=waived),
        state=state,
        state_label=STATE_LABELS[state],
    )


def _row_state(
    name: str, cp: StepLike | None, status: str, current_step: str, stopped: bool
) -> str:
    if cp is not None and cp.status == StepStatus.COMPLETED:
        return "done"
    if status == RunStatus.NEEDS_ATTENTION:
        # Parked, not over: an operator may resume it, so nothing is "not done" yet.
        return "pending" if cp is None else "held"
    if cp is None:
        if stopped:
            return "skipped"
        return "active" if name == current_step else "pending"
    if _is_finished(status):
        return "failed"  # failed, or stopped mid-step by a cancel
    if cp.status == StepStatus.IN_PROGRESS:
        return "active"
    # FAILED while the run is still active: a retry is scheduled unless it is being undone.
    return "retrying" if name == current_step else "failed"


def _summary(
    status: str,
    latest: Mapping[str, StepLike],
    money: Money,
    *,
    undoing: bool,
    fee: int,
    emailed: bool,
    awaiting: str,
) -> tuple[str, str, str]:
    amount = format_fee(money.cents or fee)
    # The engine's one predicate: a charge whose answer was lost may have held or taken the
    # money, though no output says so; only a completed give-back settles it.
    charge = latest.get(CHARGE_STEP)
    lost = (
        charge is not None
        and charge.status != StepStatus.COMPLETED
        and durable.may_have_happened(charge)
        and fee > 0
        and (latest.get(REFUND_STEP) is None or latest[REFUND_STEP].status != StepStatus.COMPLETED)
    )
    if status == RunStatus.COMPLETED:
        return (
            "completed",
            "All done — your new boarding pass is on its way",
            "We've changed your booking and emailed your confirmation and new boarding pass.",
        )
    if status in (RunStatus.FAILED, RunStatus.CANCELLED) and (money.unsettled or lost):
        # The engine never ends like this (a failed refund parks the run); if it ever does,
        # a person must look rather than the page claiming anything about money.
        return _needs_attention()
    if status == RunStatus.FAILED and money.refunded:
        return (
            "refunded",
            f"We couldn't complete the change; the {amount} fee was refunded",
            "Your original booking could not be changed. The refund is on its way to your card"
            + (" and we've emailed you the details." if emailed else "."),
        )
    if status == RunStatus.FAILED:
        return (
            "failed",
            "We couldn't complete the change",
            "You have not been charged"
            + (": the hold on your card was released. " if money.released else ". ")
            + ("We've emailed you; you're" if emailed else "You're")
            + " welcome to try again or contact us.",
        )
    if status == RunStatus.NEEDS_ATTENTION:
        return _needs_attention()
    if status == RunStatus.CANCELLED:
        return (
            "cancelled",
            "This request was stopped",
            "A member of our team stopped this request. If you didn't expect this, please "
            "contact us.",
        )
    if awaiting:
        return (
            "awaiting_approval",
            "Your fee waiver request is waiting for our team",
            "A person on our team will look at your request, usually within a day (at most 48 "
            "hours). Nothing on your booking or your card changes until then; this page updates "
            "by itself.",
        )
    if undoing:
        return (
            "working",
            "Something went wrong, so we're putting things right",
            "We couldn't complete the change. We're undoing what we started; this page "
            "updates by itself.",
        )
    if status == RunStatus.WAITING:
        return (
            "working",
            "This is taking a little longer than usual",
            "One of our partners is slow to answer. We'll keep trying; this page updates by "
            "itself.",
        )
    if status == RunStatus.PENDING and not latest:
        return (
            "working",
            "We've received your request",
            "We'll start on it in a moment. This page updates by itself.",
        )
    return (
        "working",
        "We're working on your request",
        "This usually takes less than a minute. This page updates by itself.",
    )


def _needs_attention() -> tuple[str, str, str]:
    return (
        "needs_attention",
        "A member of our team will look at this",
        "Something unusual happened, so a person will check your request and email you. "
        "You don't need to do anything.",
    )
