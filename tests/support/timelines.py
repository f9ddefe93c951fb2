"""Runs in the shapes the timeline draws, as model instances (unsaved), and an SVG reader.

The rows are what the engine writes: checkpoints holding each step's last attempt, and
`attempt_failed` / `takeover` / `sweep_requeue` events whose `data` carries ISO-8601 times.
Unit tests draw them as they are; integration tests `save()` them and open the admin page.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from agentflow.models import RunEvent, RunWait, StepCheckpoint, WorkflowRun

SVG = "{http://www.w3.org/2000/svg}"
T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
REFUND_STEPS = (
    "load_request",
    "parse_flight_details",
    "fetch_booking",
    "check_cancellation_policy",
    "calculate_penalty_fee",
    "cancel_seat",
    "charge_customer",
    "issue_boarding_pass",
    "update_crm",
    "send_confirmation_email",
)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def iso(seconds: float) -> str:
    return at(seconds).isoformat()


@dataclass
class Rows:
    run: WorkflowRun
    steps: list[StepCheckpoint] = field(default_factory=list)
    events: list[RunEvent] = field(default_factory=list)
    waits: list[RunWait] = field(default_factory=list)

    def step(self, seq: int, name: str, *, start: float, end: float | None, **fields: Any) -> None:
        values: dict[str, Any] = {
            "kind": "effect" if seq % 2 == 0 else "read",
            "status": "COMPLETED" if end is not None else "IN_PROGRESS",
            "attempts": 1,
            "fence": 1,
            "first_started_at": at(start),
            "started_at": at(start),
            "finished_at": at(end) if end is not None else None,
            "lease_expires_at": None if end is not None else at(start + 10),
            "idempotency_key": f"{self.run.pk}_step_{seq}",
        }
        values.update(fields)
        self.steps.append(StepCheckpoint(run=self.run, seq=seq, name=name, **values))

    def event(self, kind: str, *, when: float, seq: int | None = None, **fields: Any) -> None:
        self.events.append(RunEvent(run=self.run, kind=kind, at=at(when), seq=seq, **fields))

    def wait(
        self,
        seq: int,
        kind: str,
        name: str,
        *,
        start: float,
        end: float | None,
        outcome: Any = None,
        deadline: float | None = None,
        **fields: Any,
    ) -> None:
        """A wait at `seq`, resolved at `end` with `outcome` (open if `end` is None)."""
        self.waits.append(
            RunWait(
                run=self.run,
                branch=fields.pop("branch", 0),
                seq=seq,
                kind=kind,
                name=name,
                requested_at=at(start),
                resolved_at=at(end) if end is not None else None,
                outcome=outcome,
                deadline=at(deadline) if deadline is not None else None,
                **fields,
            )
        )

    def failed_attempt(
        self, seq: int, attempt: int, *, start: float, end: float, retry_in: float | None
    ) -> None:
        self.event(
            RunEvent.Kind.ATTEMPT_FAILED,
            when=end,
            seq=seq,
            data={
                "attempt": attempt,
                "fence": attempt,
                "started_at": iso(start),
                "ended_at": iso(end),
                "error": "partner said 503",
                "retry_at": iso(end + retry_in) if retry_in is not None else None,
                "owner": "celery@w1:4242:abc",
            },
        )

    def takeover(
        self, seq: int, *, claimed: float, taken: float, reason: str, recorded: float | None = None
    ) -> None:
        """`recorded`: when the row was written, if later than the takeover it tells of."""
        self.event(
            RunEvent.Kind.TAKEOVER,
            when=taken if recorded is None else recorded,
            seq=seq,
            data={
                "attempt": 2,
                "fence": 2,
                "at": iso(taken),
                "reason": reason,
                "previous": {
                    "attempt": 1,
                    "fence": 1,
                    "owner": "celery@w1:4242:abc",
                    "started_at": iso(claimed),
                    "lease_expires_at": iso(claimed + 10),
                },
            },
        )

    def save(self) -> WorkflowRun:
        """Write the rows as they are (times included: `auto_now*` is undone afterwards)."""
        created, updated = self.run.created_at, self.run.updated_at
        self.run.save()
        WorkflowRun.objects.filter(pk=self.run.pk).update(created_at=created, updated_at=updated)
        StepCheckpoint.objects.bulk_create(self.steps)
        RunWait.objects.bulk_create(self.waits)
        for event in self.events:
            when = event.at
            event.save()
            RunEvent.objects.filter(pk=event.pk).update(at=when)
        self.run.refresh_from_db()
        return self.run


def new_run(run_id: str, status: str = "COMPLETED", *, workflow: str = "rebooking") -> Rows:
    run = WorkflowRun(
        id=run_id,
        workflow=workflow,
        version=1,
        status=status,
        current_step="",
        current_seq=1,
        created_at=at(0),
        updated_at=at(0),
        wake_at=at(60) if status in ("PENDING", "RUNNING", "WAITING") else None,
    )
    return Rows(run)


def ten_step_run(run_id: str = "wf_tensteps") -> Rows:
    """The refund's ten steps, one attempt each, the effects slower than the reads."""
    rows = new_run(run_id)
    clock = 0.05
    for seq, name in enumerate(REFUND_STEPS, start=1):
        took = 0.25 if seq % 2 == 0 else 0.02
        rows.step(seq, name, start=clock, end=clock + took)
        clock += took + 0.03
    rows.run.updated_at = at(clock)
    rows.run.current_seq, rows.run.current_step = 10, REFUND_STEPS[-1]
    return rows


def eight_retries_run(run_id: str = "wf_eightretries") -> Rows:
    """`charge` fails eight times with growing back-off, then completes; one sweep on the way."""
    rows = new_run(run_id)
    rows.step(1, "prepare", start=0.01, end=0.02)
    clock = 0.05
    for attempt in range(1, 9):
        wait = min(60.0, 0.5 * 2 ** (attempt - 1))
        rows.failed_attempt(2, attempt, start=clock, end=clock + 0.1, retry_in=wait)
        clock += 0.1 + wait + 0.05
        if attempt == 5:
            rows.event(
                RunEvent.Kind.SWEEP_REQUEUE,
                when=clock - 0.03,
                seq=2,
                actor="sweeper",
                detail="WAITING at step 2, 0.2 s past its wake-up time",
                data={"status": "WAITING", "reason": "overdue", "late_seconds": 0.2},
            )
    rows.step(
        2, "charge", start=clock, end=clock + 0.3, attempts=9, fence=9, first_started_at=at(0.05)
    )
    rows.step(3, "finish", start=clock + 0.35, end=clock + 0.36)
    rows.run.updated_at = at(clock + 0.36)
    return rows


def svg_root(svg: str) -> ET.Element:
    """The picture as XML: it must parse, which also proves every text was escaped."""
    return ET.fromstring(svg)


def elements(svg: str | ET.Element, css: str) -> list[ET.Element]:
    """The `<g>` elements carrying class `css`, in document order."""
    root = svg_root(svg) if isinstance(svg, str) else svg
    return [g for g in root.iter(f"{SVG}g") if css in (g.get("class") or "").split()]


def texts(svg: str, css: str) -> list[str]:
    """The words of the `<text>` elements carrying class `css`."""
    return [
        "".join(t.itertext())
        for t in svg_root(svg).iter(f"{SVG}text")
        if css in (t.get("class") or "").split()
    ]


def title(element: ET.Element) -> str:
    found = element.find(f"{SVG}title")
    return found.text or "" if found is not None else ""


def box(element: ET.Element) -> tuple[float, float]:
    """(x, right edge) of the element's first rect."""
    rect = element.find(f"{SVG}rect")
    assert rect is not None
    x = float(rect.get("x", 0))
    return x, x + float(rect.get("width", 0))
