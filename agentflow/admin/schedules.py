"""The operator's page of schedules (docs/schedules.md, "Operators"): each declared schedule
with its cron and time zone, last and next slots, the runs of its recent slots, the slots it
skipped and why; Pause / Resume and a cron or input change under one permission
(`agentflow.pause_schedulestate`), Start a slot now under its own
(`agentflow.trigger_schedulestate`), each recorded with the operator and the reason.

The rows are the schedules' own and are never edited here: every action goes through
`agentflow._schedules.operator`.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from agentflow._schedules import ScheduleError
from agentflow._schedules import operator as schedules
from agentflow.admin.forms import ReasonForm
from agentflow.admin.pages import ActionsOnlyAdmin
from agentflow.models import ScheduleState

PAUSE_PERMISSION = "agentflow.pause_schedulestate"
TRIGGER_PERMISSION = "agentflow.trigger_schedulestate"
VERBS = ("pause", "resume", "trigger", "change")


@admin.register(ScheduleState)
class ScheduleStateAdmin(ActionsOnlyAdmin):
    change_list_template = "admin/agentflow/schedulestate/schedules.html"

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Whoever may pause or start a schedule may see the page that does it."""
        return (
            super().has_view_permission(request, obj)
            or request.user.has_perm(PAUSE_PERMISSION)
            or request.user.has_perm(TRIGGER_PERMISSION)
        )

    def get_urls(self) -> list[Any]:
        wrap = self.admin_site.admin_view
        own = [
            path(
                f"<str:name>/{verb}/",
                wrap(self.schedule_action_view),
                {"verb": verb},
                name=f"agentflow_schedulestate_{verb}",
            )
            for verb in VERBS
        ]
        return own + super().get_urls()

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            rows = [_row(view) for view in schedules.views()]
            problem = ""
        except ScheduleError as exc:  # a bad AGENTFLOW_SCHEDULES: said, never a traceback
            rows, problem = [], str(exc)
        context = {
            **self.admin_site.each_context(request),
            "title": "Schedules",
            "opts": self.opts,
            "schedules": rows,
            "problem": problem,
            "may_pause": request.user.has_perm(PAUSE_PERMISSION),
            "may_trigger": request.user.has_perm(TRIGGER_PERMISSION),
        }
        return TemplateResponse(request, self.change_list_template, context)

    def schedule_action_view(self, request: HttpRequest, name: str, verb: str) -> HttpResponse:
        needed = TRIGGER_PERMISSION if verb == "trigger" else PAUSE_PERMISSION
        if not request.user.has_perm(needed):
            raise PermissionDenied
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        back = HttpResponseRedirect(reverse("admin:agentflow_schedulestate_changelist"))
        name = unquote(name)
        form = ReasonForm(request.POST)
        if not form.is_valid():
            messages.error(request, "Give the reason: it is recorded with your name.")
            return back
        actor, reason = request.user.get_username(), form.cleaned_data["reason"]
        try:
            said = _act(name, verb, actor=actor, reason=reason, data=request.POST)
        except ScheduleError as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, said)
        return back


def _act(name: str, verb: str, *, actor: str, reason: str, data: Any) -> str:
    if verb == "trigger":
        run_id = schedules.trigger(name, actor=actor, reason=reason)
        return f"{name}: a slot started now, run {run_id}."
    if verb == "change":
        raw = (data.get("input") or "").strip()
        try:
            given = json.loads(raw) if raw else None
        except ValueError as exc:
            raise ScheduleError(f"the input is not JSON: {exc}") from None
        schedules.change(name, cron=data.get("cron") or "", input=given)
        return f"{name}: changed; the next tick reads it."
    act = schedules.pause if verb == "pause" else schedules.resume
    if act(name, actor=actor, reason=reason):
        return f"{name}: {verb}d."
    return f"{name} was {'paused already' if verb == 'pause' else 'not paused'}."


def _row(view: Any) -> dict[str, Any]:
    key = quote(view.schedule.name)
    return {
        "view": view,
        "urls": {
            verb: reverse(f"admin:agentflow_schedulestate_{verb}", args=[key]) for verb in VERBS
        },
    }
