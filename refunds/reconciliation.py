"""The nightly reconciliation (docs/refunds.md, "Reconciliation"): each UTC day's money at
Stripe against what the refund runs recorded, read only. Its workflow (`reconcile_payments`,
in refunds.workflows) lists the day at Stripe, matches it with the runs, tells finance, and
completes on a clean day or parks for an operator with every mismatch and its amounts.

A payment is a fee taken: a payment intent created that day that succeeded, matched with the
run whose `capture_fee` recorded it. A refund is a fee given back, matched with the run whose
`refund_fee` recorded it. A run belongs to the day its step finished (its hold's, for a
payment; a hold and its intent are made in the same second). Nothing here moves money.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.conf import settings

from agentflow import durable
from agentflow.durable import StepContext
from refunds import policy
from refunds.gateways import Mailer, PaymentGateway
from refunds.models import RefundRequest

#: The refund runs' steps that take and give back money, and the one that holds the fee.
HOLD, CAPTURE, GIVE_BACK = "charge_customer", "capture_fee", "refund_fee"
#: How far before the day a reconciled run may have been submitted: a run waits for an
#: approval at most AGENTFLOW_APPROVAL_TIMEOUT (48 h) before its fee is held.
SUBMITTED_BEFORE = timedelta(days=3)
#: The kinds of result, in the order finance reads them.
MISMATCHES = ("payment_without_run", "run_without_payment", "amount_differs")


# --- the steps ------------------------------------------------------------------------------
def list_day_at_stripe(ctx: StepContext) -> dict[str, Any]:
    """The day's payment intents and refunds at Stripe (every page)."""
    day = day_of(ctx.input)
    start, end = _bounds(day)
    gateway = PaymentGateway.from_settings()
    payments = [p for p in gateway.payments_created(start, end) if p["status"] == "succeeded"]
    return {
        "day": day.isoformat(),
        "payments": payments,
        "refunds": gateway.refunds_created(start, end),
    }


def match_runs(ctx: StepContext) -> dict[str, Any]:
    """Each payment and refund of the day matched with the run that recorded it."""
    listed = ctx.output_of("list_day_at_stripe")
    day = date.fromisoformat(listed["day"])
    return match(listed["payments"], listed["refunds"], runs_of_day(day), day=day)


def email_finance(ctx: StepContext) -> dict[str, Any]:
    """Finance hears which: a clean day, or the list an operator now looks at."""
    result = ctx.output_of("match_runs")
    subject, body = report(result)
    message_id = Mailer.from_settings().send(
        to=settings.REFUNDS_FINANCE_EMAIL,
        subject=subject,
        body=body,
        key=ctx.idempotency_key,
        workflow_id=ctx.run_id,
    )
    return {"message_id": message_id, "to": settings.REFUNDS_FINANCE_EMAIL}


def settle(ctx: StepContext) -> dict[str, Any]:
    """A clean day completes; anything unmatched parks the run for an operator, listed."""
    result = ctx.output_of("match_runs")
    if unmatched(result):
        raise durable.NeedsAttention(summary(result))
    return {"clean": True, "matched": len(result["matched"])}


# --- reading the runs -------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class RunMoney:
    """What one refund run recorded about money on the day: the fee it took (from
    `capture_fee`, if its hold was made that day) and the fee it gave back (`refund_fee`)."""

    run_id: str
    status: str
    taken: dict[str, Any] | None
    given_back: dict[str, Any] | None


def runs_of_day(day: date) -> list[RunMoney]:
    start = datetime.combine(day, time(), tzinfo=UTC)
    end = start + timedelta(days=1)
    candidates = RefundRequest.objects.filter(
        created_at__gte=start - SUBMITTED_BEFORE, created_at__lt=end, workflow_id__isnull=False
    ).values_list("workflow_id", flat=True)
    found = []
    for run_id in candidates:
        run = durable.snapshot(run_id)
        if run is not None:
            found.append(_money(run, start, end))
    return [money for money in found if money.taken or money.given_back]


def _money(run: durable.RunSnapshot, start: datetime, end: datetime) -> RunMoney:
    def on_day(name: str, held: str | None = None) -> dict[str, Any] | None:
        steps = [
            s for s in run.steps if s.name == name and s.status == durable.StepStatus.COMPLETED
        ]
        if not steps or not isinstance(steps[-1].output, dict):
            return None
        when = [s for s in run.steps if s.name == (held or name) and s.finished_at]
        if not when or not (start <= when[-1].finished_at < end):  # type: ignore[operator]
            return None
        return steps[-1].output

    taken = on_day(CAPTURE, held=HOLD)
    given_back = on_day(GIVE_BACK)
    return RunMoney(
        run_id=run.id,
        status=run.status,
        taken=taken if taken and taken.get("captured") else None,
        given_back=given_back if given_back and given_back.get("refunded") else None,
    )


# --- matching (pure) --------------------------------------------------------------------------
def match(
    payments: Iterable[dict[str, Any]],
    refunds: Iterable[dict[str, Any]],
    runs: Iterable[RunMoney],
    *,
    day: date,
) -> dict[str, Any]:
    """`{"day", "matched", "payment_without_run", "run_without_payment", "amount_differs"}`,
    each a list of `{"kind": "payment"|"refund", "id", "run_id", "stripe_cents",
    "run_cents"}` (a side that has none: null)."""
    runs = list(runs)
    result: dict[str, Any] = {"day": day.isoformat(), "matched": []}
    result.update({kind: [] for kind in MISMATCHES})
    sides = (
        ("payment", payments, {r.taken["payment_intent_id"]: r for r in runs if r.taken}, "taken"),
        (
            "refund",
            refunds,
            {r.given_back["refund_id"]: r for r in runs if r.given_back},
            "given_back",
        ),
    )
    for kind, at_stripe, by_id, field in sides:
        seen = set()
        for item in at_stripe:
            cents = item.get("amount_received_cents", item["amount_cents"]) or item["amount_cents"]
            run = by_id.get(item["id"])
            entry = {
                "kind": kind,
                "id": item["id"],
                "stripe_cents": cents,
                "run_id": run.run_id if run else None,
                "run_cents": None,
            }
            if run is None:
                result["payment_without_run"].append(entry)
                continue
            seen.add(item["id"])
            entry["run_cents"] = getattr(run, field)["amount_cents"]
            same = entry["run_cents"] == cents
            result["matched" if same else "amount_differs"].append(entry)
        for money_id, run in by_id.items():
            if money_id not in seen:
                result["run_without_payment"].append(
                    {
                        "kind": kind,
                        "id": money_id,
                        "run_id": run.run_id,
                        "stripe_cents": None,
                        "run_cents": getattr(run, field)["amount_cents"],
                    }
                )
    return result


def unmatched(result: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(kind, entry) for kind in MISMATCHES for entry in result[kind]]


def summary(result: dict[str, Any]) -> str:
    """One line per mismatch, with amounts: what the parked run's reason says."""
    lines = [_line(kind, entry) for kind, entry in unmatched(result)]
    return f"{len(lines)} unmatched on {result['day']}: " + "; ".join(lines)


def report(result: dict[str, Any]) -> tuple[str, str]:
    """The e-mail to finance: its subject says which, its body lists everything."""
    wrong = unmatched(result)
    day = result["day"]
    if not wrong:
        subject = f"Reconciliation {day}: clean, {len(result['matched'])} matched"
        return subject, f"Every payment and refund at Stripe on {day} matches a refund run.\n"
    subject = f"Reconciliation {day}: {len(wrong)} unmatched, waiting for an operator"
    body = [f"Stripe and the refund runs disagree on {day}:", ""]
    body += [f"- {_line(kind, entry)}" for kind, entry in wrong]
    body += [
        "",
        f"{len(result['matched'])} matched. The reconciliation run is parked for an "
        "operator; nothing was moved.",
    ]
    return subject, "\n".join(body) + "\n"


def _line(kind: str, entry: dict[str, Any]) -> str:
    what = {
        "payment_without_run": f"{entry['kind']} without a completed run",
        "run_without_payment": f"run without its {entry['kind']}",
        "amount_differs": "amount differs",
    }[kind]
    amounts = []
    if entry["stripe_cents"] is not None:
        amounts.append(f"Stripe {policy.format_amount(entry['stripe_cents'], policy.CURRENCY)}")
    if entry["run_cents"] is not None:
        amounts.append(f"run {policy.format_amount(entry['run_cents'], policy.CURRENCY)}")
    run = f" (run {entry['run_id']})" if entry["run_id"] else ""
    return f"{what}: {entry['id']}{run}, {', '.join(amounts)}"


# --- the day ----------------------------------------------------------------------------------
def day_of(given: dict[str, Any]) -> date:
    """The day reconciled: `"day"` if given (by hand), else the one before the slot's
    (`scheduled_at`, 02:00 UTC: the previous day is over)."""
    if given.get("day"):
        return date.fromisoformat(given["day"])
    slot = datetime.fromisoformat(given["scheduled_at"].replace("Z", "+00:00"))
    return slot.astimezone(UTC).date() - timedelta(days=1)


def _bounds(day: date) -> tuple[int, int]:
    start = datetime.combine(day, time(), tzinfo=UTC)
    return int(start.timestamp()), int((start + timedelta(days=1)).timestamp())
