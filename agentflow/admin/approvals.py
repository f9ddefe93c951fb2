"""What the admin shows and does about waits (docs/workflows.md, "Timers, signals and approvals"):
the call a run waits to have approved, every decision made at its positions, and the Approve /
Reject verbs for holders of `agentflow.approve_workflowrun`.

Decisions go through the store (`store.wait_decide`), fenced on the run's row lock like every
operator action; this module only reads waits to show them.
"""

from __future__ import annotations

from typing import Any

from django.db.models import OuterRef, Subquery
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from agentflow import _store as store
from agentflow._base.states import RunStatus, WaitKind
from agentflow.admin.display import pretty, when
from agentflow.admin.privacy import APPROVE, Privacy
from agentflow.models import RunWait, WorkflowRun

PERMISSION = APPROVE

#: A WAITING run's badge says what for (the status word alone says only "Waiting").
WAITING_LABELS = {
    WaitKind.APPROVAL: "Waiting for approval",
    WaitKind.SIGNAL: "Waiting for a signal",
    WaitKind.TIMER: "Waiting for a timer",
}
RETRY_LABEL = "Waiting to retry"


def may_decide(request: HttpRequest) -> bool:
    return request.user.has_perm(PERMISSION)


def approve(run_id: str, *, actor: str, reason: str, digest: str, reply: str = "") -> None:
    store.wait_decide(run_id, approved=True, actor=actor, reason=reason, digest=digest, reply=reply)


def reject(run_id: str, *, actor: str, reason: str, digest: str, reply: str = "") -> None:
    store.wait_decide(
        run_id, approved=False, actor=actor, reason=reason, digest=digest, reply=reply
    )


def open_wait_kind() -> Subquery:
    """The kind of the open wait at each run's current position (NULL: none), one probe of
    the (run, branch, seq) unique index per row."""
    return Subquery(
        RunWait.objects.filter(
            run=OuterRef("pk"),
            branch=OuterRef("branch"),
            seq=OuterRef("current_seq"),
            resolved_at__isnull=True,
        )
        .order_by()
        .values("kind")[:1]
    )


def status_label(run: WorkflowRun) -> str:
    if run.status != RunStatus.WAITING:
        return run.get_status_display()
    kind = getattr(run, "open_wait_kind", None)
    return WAITING_LABELS.get(kind, RETRY_LABEL) if kind else RETRY_LABEL


def pending_call(run: WorkflowRun, shown: Privacy) -> dict[str, Any] | None:
    """The call the run waits to have approved, as the confirmation page and run page show it
    to this viewer (`shown`: its sensitive arguments masked unless they may read them)."""
    pending = store.wait_pending(run)
    if pending is None or pending.kind != WaitKind.APPROVAL:
        return None
    return {
        "call": pending.name,
        "arguments": pretty(shown.value(pending.arguments)),
        "digest": pending.digest,
        "requested": when(pending.requested_at),
        "expires": when(pending.deadline),
    }


def waits_block(run: WorkflowRun, shown: Privacy) -> str:
    """Every wait of the run, newest first: what it waited for, and how it ended (who decided,
    why, what the customer was told, or the timeout)."""
    rows = shown.rows(RunWait.objects.filter(run=run).order_by("-branch", "-seq")[:50])
    if not rows:
        return "—"
    return format_html(
        '<table class="af-waits"><thead><tr><th>position</th><th>waits for</th><th>call</th>'
        "<th>asked</th><th>outcome</th></tr></thead><tbody>{}</tbody></table>",
        format_html_join("", "<tr>{}</tr>", ((_row(run, wait),) for wait in rows)),
    )


def _row(run: WorkflowRun, wait: RunWait) -> str:
    position = f"#{wait.seq}" + (f" (branch {wait.branch})" if wait.branch != run.branch else "")
    if wait.kind == WaitKind.APPROVAL:
        call = format_html(
            '<code>{}</code>{}<div class="af-key">digest {}</div>',
            wait.name,
            pretty(wait.arguments),
            wait.digest[:16],
        )
    elif wait.kind == WaitKind.SIGNAL:
        call = format_html("signal <code>{}</code>", wait.name)
    else:
        call = format_html("until {}", when(wait.deadline))
    return format_html(
        "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
        position,
        wait.kind,
        call,
        when(wait.requested_at),
        _outcome(wait),
    )


def _outcome(wait: RunWait) -> str:
    outcome = wait.outcome if isinstance(wait.outcome, dict) else None
    if wait.resolved_at is None or outcome is None:
        deadline = f" (until {when(wait.deadline)})" if wait.deadline else ""
        return format_html('<span class="af-parked">open{}</span>', deadline)
    if wait.kind == WaitKind.APPROVAL:
        if outcome.get("timed_out"):
            verdict = "rejected: no decision in time"
        else:
            verdict = "approved" if outcome.get("approved") else "rejected"
        reply = outcome.get("reply")
        return format_html(
            "<strong>{}</strong> by {} at {}<div>{}</div>{}",
            verdict,
            wait.actor or "—",
            when(wait.resolved_at),
            wait.reason or "(no reason given)",
            format_html('<div class="af-reply">told the customer: “{}”</div>', reply)
            if isinstance(reply, str) and reply
            else "",
        )
    if outcome.get("timed_out"):
        return format_html("timed out at {}", when(wait.resolved_at))
    if wait.kind == WaitKind.SIGNAL:
        return format_html(
            "received {} ({}){}",
            when(wait.resolved_at),
            wait.reason,
            pretty(outcome.get("payload")),
        )
    return format_html("woke at {}", when(wait.resolved_at))
