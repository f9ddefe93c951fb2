"""Fork an agent run from a position, from the run page: a confirmation that lists what the
fork sets aside — above all the side effects that happened — asks for a reason, then calls
`agentflow._engine.forks.fork` (which asks partners about effects that may have happened, then
`store.run_fork`). The store decides what is safe; its refusals become messages.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.admin.options import ModelAdmin
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from agentflow import _store as store
from agentflow._base import outcomes
from agentflow._base.states import RunStatus
from agentflow._core import registry
from agentflow._engine import forks
from agentflow.admin import actions, privacy
from agentflow.admin.display import badge
from agentflow.admin.forms import ReasonForm
from agentflow.admin.recorded_calls import Part, read_call
from agentflow.agent.fingerprint import LLM_CALL_NAME
from agentflow.agent.loop import CodeWorkflow
from agentflow.models import StepCheckpoint, WorkflowRun

TEMPLATE = "admin/agentflow/workflowrun/fork_confirmation.html"
#: Statuses whose run page offers Fork (the store still decides).
OFFERED_FOR = (RunStatus.NEEDS_ATTENTION, RunStatus.FAILED)
EXPLANATION = (
    "Fork continues this run from the chosen position on a new branch. The calls before it stay "
    "as they are (replayed, never repeated); the calls from it on are set aside as superseded "
    "history, still shown on the run page. A call the new branch makes again with the same "
    "tool and arguments adopts the recorded result and idempotency key instead of being made "
    "again; every other new call gets a key that names the branch."
)


class ForkForm(ReasonForm):
    position = forms.IntegerField(min_value=1, widget=forms.HiddenInput)


def offered(run: WorkflowRun) -> bool:
    """Does the run page offer Fork for this run? (Agent, deployed, stopped.)"""
    workflow = registry.lookup(run.workflow, run.version)
    return isinstance(workflow, CodeWorkflow) and run.status in OFFERED_FOR


def fork_url(run_id: str) -> str:
    return reverse("admin:agentflow_workflowrun_fork", args=(quote(run_id),))


def fork_view(model_admin: Any, request: HttpRequest, object_id: str) -> HttpResponse:
    """GET `?position=N`: what a fork from N sets aside, and the reason asked. POST: fork."""
    if not model_admin.has_operate_permission(request):
        raise PermissionDenied
    if request.method not in ("GET", "POST"):
        return HttpResponseNotAllowed(["GET", "POST"])
    run_id = unquote(object_id).replace("\x00", "")  # Postgres text cannot hold NUL
    run = WorkflowRun.objects.filter(pk=run_id).first()
    if run is None or run_id != unquote(object_id):
        messages.warning(request, f"There is no workflow run “{run_id}” to fork.")
        return HttpResponseRedirect(reverse("admin:agentflow_workflowrun_changelist"))
    back = HttpResponseRedirect(
        reverse("admin:agentflow_workflowrun_change", args=(quote(run_id),))
    )
    names = _recorded(run_id)
    highest = max(names, default=0) + 1  # one past the last call: continue after it
    data = request.POST if request.method == "POST" else request.GET
    position = _position(data.get("position"))
    if position is None or not 1 <= position <= highest:
        messages.warning(
            request, f"Choose a position to fork run {run_id} from: a number from 1 to {highest}."
        )
        return back
    if request.method == "GET" and not offered(run):
        messages.warning(
            request,
            f"Run {run_id} cannot be forked: only diverged, parked or failed agent runs can.",
        )
        return back
    form = ForkForm(
        request.POST if request.method == "POST" else None, initial={"position": position}
    )
    if form.is_valid():
        _perform(request, run, form.cleaned_data["position"], form.cleaned_data["reason"])
        return back
    return _confirmation(model_admin, request, run, position, names, form)


def _perform(request: HttpRequest, run: WorkflowRun, position: int, reason: str) -> None:
    def act(run_id: str, *, actor: str, reason: str) -> str:
        forks.fork(run_id, position=position, actor=actor, reason=reason)
        branch = WorkflowRun.objects.filter(pk=run_id).values_list("branch", flat=True).first()
        return f"forked from position {position}; it continues there on branch {branch}"

    verb = actions.Verb(
        name="fork",
        label="Fork",
        done="forked",
        offered_for=OFFERED_FOR,
        explanation=EXPLANATION,
        act=act,
    )
    summary = {field: getattr(run, field) for field in actions.RUN_SUMMARY if field != "pk"}
    actions.perform(request, verb, [{"pk": run.pk, **summary}], reason)


def _confirmation(
    model_admin: ModelAdmin[Any],
    request: HttpRequest,
    run: WorkflowRun,
    position: int,
    names: dict[int, str],
    form: ForkForm,
) -> TemplateResponse:
    preview = privacy.for_run(request, run).rows(store.fork_preview(run.pk, position))
    set_aside = [read_call(cp) for cp in preview]
    turns = [c for c in set_aside if c.part == Part.TURN]
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"Fork this run from position {position}?",
        "subtitle": None,
        "opts": model_admin.opts,
        "run": run,
        "run_badge": badge(run.status, run.get_status_display()),
        "position": position,
        "positions": _choices(names),
        "explanation": EXPLANATION,
        "set_aside": set_aside,
        "effects": [c for c in set_aside if c.made_effect],
        "unknown": [
            read_call(cp)
            for cp in preview
            if outcomes.unsettled(kind=cp.kind, status=cp.status, retryable=cp.retryable)
        ],
        "turns_tokens": sum(c.tokens.total for c in turns if c.tokens is not None),
        "turns": len(turns),
        "branch": run.branch + 1,
        "form": form,
        "media": model_admin.media,
    }
    return TemplateResponse(request, TEMPLATE, context)


def _recorded(run_id: str) -> dict[int, str]:
    """The run's recorded calls' names by position."""
    rows = StepCheckpoint.objects.filter(run_id=run_id).order_by("seq").values_list("seq", "name")
    return dict(rows)


def _choices(names: dict[int, str]) -> list[tuple[int, str]]:
    """Every position a fork may start at, named by its call, for the page's picker."""
    after = max(names, default=0) + 1
    return [(seq, f"#{seq} {_call_name(name)}") for seq, name in names.items()] + [
        (after, f"#{after} (after the last call)")
    ]


def _call_name(name: str) -> str:
    return "model turn" if name == LLM_CALL_NAME else name


def _position(value: Any) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None
