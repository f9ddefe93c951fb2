"""A run's steps and events on its detail page: read-only, in order, loaded in one query each."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from agentflow._base.states import StepStatus
from agentflow._core import links
from agentflow.admin.display import badge, pretty, when
from agentflow.admin.privacy import OPEN, Privacy
from agentflow.models import RunEvent, StepCheckpoint


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False
    #: What this request's viewer may read of the run (set per request by the run admin).
    privacy: Privacy = OPEN

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Whoever may see a run may see its steps and events: they are part of it."""
        user = request.user
        return user.has_perm("agentflow.view_workflowrun") or user.has_perm(
            "agentflow.change_workflowrun"
        )


class StepInline(ReadOnlyInline):
    """One row per checkpoint, in sequence; columns grouped so the table fits beside the menu."""

    model = StepCheckpoint
    verbose_name = "step"
    classes = ("af-steps",)
    ordering = ("seq",)  # the model's default orders by run first, which joins the runs table
    fields = readonly_fields = ("step", "state", "lease", "times", "result")
    #: Set per request by the run admin (inline instances are made per request).
    run_ref: links.RunRef | None = None

    @admin.display(description="seq, name, kind / idempotency key")
    def step(self, cp: StepCheckpoint) -> str:
        return format_html(
            '<strong>#{} {}</strong> <span class="af-kind">{}</span><br>'
            '<code class="af-key" title="idempotency key">{}</code>',
            cp.seq,
            cp.name,
            cp.kind,
            cp.idempotency_key,
        )

    @admin.display(description="status / attempts")
    def state(self, cp: StepCheckpoint) -> str:
        label = cp.get_status_display()
        if cp.status == StepStatus.FAILED:
            label += ", will retry" if cp.retryable else ", permanent"
        attempts = f"{cp.attempts} attempt{'s' if cp.attempts != 1 else ''}"
        return format_html("{}<br>{}", badge(cp.status, label), attempts)

    @admin.display(description="lease owner / expiry")
    def lease(self, cp: StepCheckpoint) -> str:
        if not cp.lease_expires_at:
            return "—"
        expired = cp.lease_expires_at <= timezone.now()
        return format_html(
            '<code class="af-code">{}</code><br><span class="{}">until {}{}</span>',
            cp.lease_owner or "?",
            "af-overdue" if expired else "",
            when(cp.lease_expires_at),
            " (expired)" if expired else "",
        )

    @admin.display(description="started / finished")
    def times(self, cp: StepCheckpoint) -> str:
        return format_html(
            '<span class="af-nowrap">{}<br>{}</span>', when(cp.started_at), when(cp.finished_at)
        )

    @admin.display(description="output / error")
    def result(self, cp: StepCheckpoint) -> str:
        cp = self.privacy.row(cp)
        if cp.error:
            return format_html('<div class="af-error">{}</div>', pretty(cp.error, text=True))
        return format_html("{}{}", self.partner_links(cp), pretty(cp.output))

    def partner_links(self, cp: StepCheckpoint) -> str:
        """What the domain says this step made at a partner (e.g. the Stripe payment)."""
        if self.run_ref is None:
            return ""
        step = links.StepRef(
            seq=cp.seq, name=cp.name, kind=cp.kind, status=cp.status, output=cp.output
        )
        found = self.privacy.links(links.step_links(self.run_ref, step))
        if not found:
            return ""
        anchors = format_html_join(
            " · ",
            '<a href="{}" title="{}" rel="noopener" target="_blank">{}</a>',
            ((k.url, k.title, k.label) for k in found),
        )
        return format_html('<div class="af-partner">Partner: {}</div>', anchors)


class EventInline(ReadOnlyInline):
    model = RunEvent
    verbose_name = "event"
    classes = ("af-events",)
    ordering = ("at", "id")
    fields = readonly_fields = ("at_label", "kind_label", "actor", "detail_block")

    @admin.display(description="at")
    def at_label(self, event: RunEvent) -> str:
        return format_html('<span class="af-nowrap">{}</span>', when(event.at))

    @admin.display(description="kind")
    def kind_label(self, event: RunEvent) -> str:
        return format_html(
            '{}<br><code class="af-code">{}</code>', event.get_kind_display(), event.kind
        )

    @admin.display(description="detail / data")
    def detail_block(self, event: RunEvent) -> str:
        event = self.privacy.row(event)
        if event.data in (None, {}, []):
            return pretty(event.detail, text=True)
        step = f"step #{event.seq}: " if event.seq is not None else ""
        return format_html(
            "{}{}{}",
            step,
            pretty(event.detail, text=True) if event.detail else "",
            pretty(event.data),
        )
