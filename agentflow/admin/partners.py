"""The operator's page per partner (docs/partner-limits.md, "What happens"): its limit, calls in
flight, waiting runs, recent 429s and errors, the breaker; and Pause / Resume by hand, under a
permission of their own (`agentflow.pause_partnerstate`), each recorded with the operator and the
reason.

The rows are partner limits' and are never edited here: the two actions go through their store
(`agentflow._limits.store`).
A partner key is any name AGENTFLOW_PARTNER_LIMITS gives (a model's `openai/gpt-4o-mini`, a
`crm:eu` region, spaces, any script): in the actions' URLs it is quoted the admin's way, as
object ids are, so it never breaks a URL or its reverse.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from agentflow._limits import rules
from agentflow._limits.store import PartnerView, partner_pause, partner_resume, partners_view
from agentflow.admin.forms import ReasonForm
from agentflow.admin.pages import ActionsOnlyAdmin
from agentflow.exceptions import partner_wait_reason
from agentflow.models import PartnerEvent, PartnerState

PAUSE_PERMISSION = "agentflow.pause_partnerstate"
#: Recent events shown per partner.
RECENT_EVENTS = 10


@admin.register(PartnerState)
class PartnerStateAdmin(ActionsOnlyAdmin):
    change_list_template = "admin/agentflow/partnerstate/partners.html"

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Whoever may pause a partner may see the page that pauses it."""
        return super().has_view_permission(request, obj) or request.user.has_perm(PAUSE_PERMISSION)

    def get_urls(self) -> list[Any]:
        wrap = self.admin_site.admin_view
        own = [
            path(
                f"<str:partner>/{verb}/",
                wrap(self.partner_action_view),
                {"verb": verb},
                name=f"agentflow_partnerstate_{verb}",
            )
            for verb in ("pause", "resume")
        ]
        return own + super().get_urls()

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "title": "Partners",
            "opts": self.opts,
            "partners": [_row(view) for view in partners_view(rules.configured())],
            "may_pause": request.user.has_perm(PAUSE_PERMISSION),
            "form": ReasonForm(),
        }
        return TemplateResponse(request, self.change_list_template, context)

    def partner_action_view(self, request: HttpRequest, partner: str, verb: str) -> HttpResponse:
        if not request.user.has_perm(PAUSE_PERMISSION):
            raise PermissionDenied
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        back = HttpResponseRedirect(reverse("admin:agentflow_partnerstate_changelist"))
        partner = unquote(partner)
        limit = rules.limit_for(partner)
        form = ReasonForm(request.POST)
        if limit is None:
            messages.error(request, f"{partner} is not in AGENTFLOW_PARTNER_LIMITS.")
            return back
        if not form.is_valid():
            messages.error(request, "Give the reason: it is recorded with your name.")
            return back
        actor, reason = request.user.get_username(), form.cleaned_data["reason"]
        act = partner_pause if verb == "pause" else partner_resume
        if act(limit, actor=actor, reason=reason):
            messages.success(request, f"{partner}: {verb}d.")
        else:
            messages.warning(
                request, f"{partner} was not {'running' if verb == 'pause' else 'held'}."
            )
        return back


def _row(view: PartnerView) -> dict[str, Any]:
    limit = view.limit
    parts = []
    if limit is not None and limit.rate_text:
        parts.append(f"{limit.rate_text} (now {view.speed:.0%})")
    if limit is not None and limit.concurrency is not None:
        parts.append(f"{limit.concurrency} in flight")
    recent = PartnerEvent.objects.filter(partner=view.partner).order_by("-at", "-id")
    key = quote(view.partner)  # "/" and the like escaped, as the admin escapes object ids
    return {
        "view": view,
        "limit": ", ".join(parts) or ("breaker only" if limit is not None else "not configured"),
        "breaker": "paused" if view.paused else view.breaker.replace("_", " "),
        # The run page's sentence for each reason ("2 waiting for stripe: rate limit").
        "waiting": ", ".join(
            f"{n} {partner_wait_reason(view.partner, why)}"
            for why, n in sorted(view.waiting_by_reason.items())
        ),
        "last_rate_limited": _at(view.last_rate_limited_at),
        "last_error": _at(view.last_error_at),
        "events": list(recent[:RECENT_EVENTS]),
        "configured": limit is not None,
        "pause_url": reverse("admin:agentflow_partnerstate_pause", args=[key]),
        "resume_url": reverse("admin:agentflow_partnerstate_resume", args=[key]),
    }


def _at(epoch: float | None) -> datetime | None:
    return datetime.fromtimestamp(epoch, tz=UTC) if epoch else None
