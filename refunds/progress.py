"""A refund run's progress for its customer: engine statuses in, the sentences of
`refunds.wording` out (and nothing else: no step's error or output, no operator's words)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agentflow import durable
from agentflow.durable import RunStatus, StepStatus
from refunds import waivers, wording
from refunds.wording import date_in_words, format_fee

#: The standard fare's change fee (docs/refunds.md), shown until the run has worked out the real
#: one.
DEFAULT_FEE_CENTS = 4500

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
    #: One of `wording.STATE_LABELS`' keys; the CSS and the script key their look on it.
    state: str
    state_label: str


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


def step_label(name: str, *, fee_cents: int = DEFAULT_FEE_CENTS, waived: bool = False) -> str:
    if waived and name in wording.WAIVED_LABELS:  # waived by our team, not a free fare
        return wording.WAIVED_LABELS[name]
    if not waived and fee_cents <= 0 and name in wording.NO_FEE_LABELS:
        return wording.NO_FEE_LABELS[name]
    label = wording.STEP_LABELS.get(name)
    return (label.say(fee=format_fee(fee_cents)) if label else "") or wording.GENERIC_LABEL


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
    run worked out (None until it has); `reason` a failure explanation from `wording.failure`
    (anything else is not shown), when the change could not be made; `emailed` whether the
    customer was written to about it; `details` what changed (see `outcome_details`), shown
    once final; `outputs` the completed steps' outputs, which say what happened to the money
    (and to a fee waiver); `awaiting_approval` the step the run waits on an operator's approval
    for, if any (`durable.snapshot(...).waiting_for == "approval"`).
    """
    waiver = waivers.outcome_of((outputs or {}).get(waivers.STEP))
    waived = waiver is not None and waiver.granted
    fee = DEFAULT_FEE_CENTS if fee_cents is None else fee_cents
    latest = _latest_by_name(steps)
    # An active run whose current step is off the forward path is running compensations.
    undoing = not _is_finished(status) and bool(current_step) and current_step not in planned
    awaiting = "" if _is_finished(status) else awaiting_approval
    rows = [
        _row(
            name,
            latest.get(name),
            status=status,
            current_step=current_step,
            stopped=undoing or _is_finished(status),
            fee=fee,
            waived=waived,
            awaiting=awaiting,
        )
        for name in planned
    ]
    extra = sorted(
        (cp for name, cp in latest.items() if name not in planned), key=lambda cp: cp.seq
    )
    rows += [
        _row(
            cp.name,
            cp,
            status=status,
            current_step=current_step,
            stopped=False,
            fee=fee,
            waived=waived,
            awaiting=awaiting,
        )
        for cp in extra
    ]
    money = Money.of(outputs or {})
    outcome, headline, message = _summary(
        status, latest, money, undoing=undoing, fee=fee, emailed=emailed, awaiting=awaiting
    )
    if reason and outcome in ("failed", "refunded"):
        message = f"{wording.failure_told(reason.strip())} {message}"
    final = outcome not in ("working", "awaiting_approval")
    return Progress(
        outcome=outcome,
        headline=headline,
        message=message,
        final=final,
        steps=tuple(rows),
        details=tuple(details) if final and outcome != "needs_attention" else (),
    )


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
    """What a finished run changed, or did not, from its completed steps' outputs, as the
    sentences of `refunds.wording` (a fact not of its kind leaves its line out).

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
            charged = wording.FEE_CHARGED.say(fee=fee)
        elif waiver is not None and waiver.granted:
            charged = wording.FEE_WAIVED
        else:
            charged = wording.FEE_NONE
        lines = [
            wording.NEW_FLIGHT.say(
                flight=issued.get("flight", ""), date=date_in_words(issued.get("date", ""))
            ),
            wording.NEW_SEAT.say(seat=issued.get("seat", "")),
            charged,
        ]
        if waiver is not None:
            lines.append(waiver.customer_line)
        if outputs.get("send_confirmation_email"):
            lines.append(wording.CONFIRMATION_SENT)
        return tuple(line for line in lines if line)
    if status not in (RunStatus.FAILED, RunStatus.CANCELLED):
        return ()
    if not booking:
        return (wording.UNTOUCHED, wording.NO_EMAIL)
    released = outputs.get("cancel_seat") or {}
    old = {"flight": booking.get("flight", ""), "date": date_in_words(booking.get("date", ""))}
    if released and (outputs.get("reinstate_seat") or {}).get("reinstated"):
        lines = [wording.SEAT_BACK.say(seat=released.get("seat", ""), **old)]
    elif released:
        lines = [wording.SEAT_RELEASED.say(seat=released.get("seat", ""), **old)]
    else:
        lines = [wording.BOOKING_AS_IT_WAS.say(seat=booking.get("seat", ""), **old)]
    if waiver is not None:
        lines.append(waiver.customer_line)
    if money.refunded:
        lines.append(wording.FEE_REFUNDED.say(fee=fee))
    elif money.released:
        lines.append(wording.FEE_RELEASED.say(fee=fee))
    if (outputs.get("notify_failure") or {}).get("sent"):
        lines.append(wording.DETAILS_EMAILED)
    return tuple(line for line in lines if line)


def archived() -> Progress:
    """A request whose run retention deleted (docs/protocol.md, "Retention"). Only finished runs are
    deleted, so it is over; which way it ended went to the customer by e-mail at the time, and is
    not kept."""
    return Progress(
        outcome="archived",
        headline=wording.ARCHIVED,
        message=wording.ARCHIVED_SAID,
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
        state_label=wording.STATE_LABELS[state],
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
        return "completed", wording.DONE, wording.DONE_SAID
    if status in (RunStatus.FAILED, RunStatus.CANCELLED) and (money.unsettled or lost):
        # The engine never ends like this (a failed refund parks the run); if it ever does,
        # a person must look rather than the page claiming anything about money.
        return _needs_attention()
    if status == RunStatus.FAILED and money.refunded:
        coming = wording.REFUND_COMING_EMAILED if emailed else wording.REFUND_COMING
        return (
            "refunded",
            wording.REFUNDED.say(fee=amount) or wording.FAILED,
            f"{wording.NOT_CHANGED} {coming}",
        )
    if status == RunStatus.FAILED:
        charged = wording.HOLD_GONE if money.released else wording.NOT_CHARGED
        then = wording.EMAILED_TRY_AGAIN if emailed else wording.TRY_AGAIN
        return "failed", wording.FAILED, f"{charged} {then}"
    if status == RunStatus.NEEDS_ATTENTION:
        return _needs_attention()
    if status == RunStatus.CANCELLED:
        return "cancelled", wording.STOPPED, wording.STOPPED_SAID
    if awaiting:
        within = wording.AWAITING_WITHIN.say(within=waivers.decided_within())
        return (
            "awaiting_approval",
            wording.AWAITING,
            f"{within} {wording.AWAITING_NOTHING_MOVES}".strip(),
        )
    if undoing:
        return "working", wording.UNDOING, wording.UNDOING_SAID
    if status == RunStatus.WAITING:
        return "working", wording.SLOW, wording.SLOW_SAID
    if status == RunStatus.PENDING and not latest:
        return "working", wording.RECEIVED, wording.RECEIVED_SAID
    return "working", wording.WORKING, wording.WORKING_SAID


def _needs_attention() -> tuple[str, str, str]:
    return "needs_attention", wording.LOOKING, wording.LOOKING_SAID
