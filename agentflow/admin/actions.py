"""Retry, Cancel, Resume now, Approve and Reject for operators: ask for a reason, call the
store, report each run's outcome.

The store decides what is safe (`store.ActionRefused`) and records the event with the actor and
reason (I6); this module only turns its answers into messages, never into a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.contrib.admin import helpers
from django.contrib.admin.options import ModelAdmin
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from agentflow import _children
from agentflow import _store as store
from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus
from agentflow._builds import routing
from agentflow._core import registry
from agentflow._core.replies import Replies
from agentflow.admin import approvals, privacy
from agentflow.admin.display import badge
from agentflow.admin.forms import DecisionForm, ReasonForm
from agentflow.models import WorkflowRun

logger = logging.getLogger(__name__)

#: One action touches at most this many runs: each is its own transaction and message line.
MAX_RUNS_PER_ACTION = 500
#: Refusals reported one by one before the rest are summed up in one line.
MAX_REFUSAL_MESSAGES = 20
CONFIRMATION_TEMPLATE = "admin/agentflow/workflowrun/action_confirmation.html"
#: What the confirmation page and the messages say about each run.
RUN_SUMMARY = ("pk", "workflow", "version", "status", "current_step", "current_seq")


@dataclass(frozen=True, kw_only=True)
class Verb:
    name: str
    label: str
    done: str
    #: Statuses for which the detail page offers the button (the store still decides).
    offered_for: tuple[str, ...]
    explanation: str
    #: The store function: (run_id, *, actor, reason), raising `store.ActionRefused`; it may
    #: return what happens next, in words, when the action is not over at once.
    act: Callable[..., str | None]
    #: Who may: "operate" (the model's change permission) or "approve"
    #: (`agentflow.approve_workflowrun`, for Approve and Reject).
    permission: str = "operate"


RETRY = Verb(
    name="retry",
    label="Retry",
    done="retried",
    offered_for=(RunStatus.FAILED, RunStatus.NEEDS_ATTENTION),
    explanation=(
        "Retry resumes each run at the step where it stopped, with a fresh retry budget and "
        "the same idempotency key, so a partner that already acted replays its first answer "
        "instead of acting twice. Only failed or parked runs can be retried, and never one "
        "whose effects were already undone by compensation."
    ),
    act=store.run_retry,
)
CANCEL = Verb(
    name="cancel",
    label="Cancel",
    done="cancelled",
    offered_for=(*ACTIVE_RUN_STATUSES, RunStatus.NEEDS_ATTENTION),
    explanation=(
        "Cancel stops each unfinished run for good without keeping any money: what it did is "
        "undone by its compensations (a fee is refunded) and the customer is told, then it ends "
        "cancelled. A step that is running finishes first, so nothing is undone blindly. An "
        "effect whose outcome is unknown is asked of the partner first: found, it is undone too; "
        "if the partner cannot tell, the run is parked for a person."
    ),
    act=_children.cancel,
)
RESUME = Verb(
    name="resume",
    label="Resume now",
    done="resumed",
    offered_for=ACTIVE_RUN_STATUSES,
    explanation=(
        "Resume now publishes each run's current step at once instead of at its wake-up time: "
        "a run waiting to retry retries now, a run whose message was lost is picked up without "
        "waiting for the sweeper. A step that a live worker is running stays with that worker, "
        "and the partner sees the same idempotency key as before."
    ),
    act=store.run_resume,
)
APPROVE = Verb(
    name="approve",
    label="Approve",
    done="approved",
    offered_for=(RunStatus.WAITING,),
    explanation=(
        "Approve lets the run make the call shown below, exactly as shown: the decision is "
        "recorded at this position with your username and reason, and binds to this call's "
        "digest, so a call with another amount or target would need a decision of its own. "
        "Your reason stays with your team; what the customer is told, if anything, is chosen "
        "below on its own and shown to you before you confirm."
    ),
    act=approvals.approve,
    permission="approve",
)
REJECT = Verb(
    name="reject",
    label="Reject",
    done="rejected",
    offered_for=(RunStatus.WAITING,),
    explanation=(
        "Reject stops the call shown below from being made: the run goes on without it (a "
        "workflow takes its rejected branch; an agent's model is told the call was rejected, "
        "and why). Recorded at this position with your username and reason, which stay with "
        "your team; what the customer is told, if anything, is chosen below on its own and "
        "shown to you before you confirm."
    ),
    act=approvals.reject,
    permission="approve",
)
MOVE = Verb(
    name="move",
    label="Move to the current build",
    done="moved to the current build",
    offered_for=(*ACTIVE_RUN_STATUSES, RunStatus.NEEDS_ATTENTION),
    explanation=(
        "Move runs each run's next step on this build's code instead of the build it is on. "
        "The same check as a deploy's comes first: every step it recorded must be in this "
        "build in the same order and kind (an agent run must replay with identical calls), "
        "and every compensation it may need must still exist; otherwise the move is refused "
        "with the first difference. A parked run then resumes as a retry does."
    ),
    act=routing.move,
)
VERBS = {verb.name: verb for verb in (RETRY, RESUME, CANCEL, APPROVE, REJECT, MOVE)}


def perform(
    request: HttpRequest, verb: Verb, runs: list[dict[str, Any]], reason: str, **extra: Any
) -> None:
    """Apply `verb` to each run in its own transaction and say how each one went (`extra`: the
    verb's own fields, e.g. the digest of the call an approver was shown)."""
    actor = request.user.get_username()
    done: list[dict[str, Any]] = []
    refused: list[tuple[str, str]] = []
    pending: list[tuple[str, str]] = []
    for run in runs:
        try:
            next_step = verb.act(run["pk"], actor=actor, reason=reason, **extra)
        except store.ActionRefused as exc:
            # A refusal may quote the run (a move's difference, a partner's answer): masked.
            refused.append((run["pk"], privacy.said(request, run, str(exc))))
        except DatabaseError:
            logger.exception("operator %s of %s failed", verb.name, run["pk"])
            refused.append((run["pk"], "the database did not accept the change; try again"))
        else:
            if next_step:
                pending.append((run["pk"], privacy.said(request, run, next_step)))
            else:
                done.append(run)
    for run_id, what in pending[:MAX_REFUSAL_MESSAGES]:
        messages.success(request, f"Run {run_id}: {what}.")
    if len(done) == 1:
        run = done[0]
        step = f"#{run['current_seq']} {run['current_step']}"
        then = {
            RETRY: f" It resumes at step {step}.",
            RESUME: f" Step {step} was published again.",
            APPROVE: f" Step {step} runs now.",
            REJECT: f" Step {step} records the rejection and the run goes on.",
        }.get(verb, "")
        messages.success(request, f"Run {run['pk']} {verb.done}.{then}")
    elif done:
        messages.success(request, f"{len(done)} runs {verb.done}.")
    for run_id, why in refused[:MAX_REFUSAL_MESSAGES]:
        messages.warning(request, f"Run {run_id} was not {verb.done}: {why}.")
    if len(refused) > MAX_REFUSAL_MESSAGES:
        rest = len(refused) - MAX_REFUSAL_MESSAGES
        messages.warning(request, f"… and {rest} more runs were not {verb.done}.")


def action_view(model_admin: Any, request: HttpRequest, object_id: str, verb: str) -> HttpResponse:
    """The run page's buttons (Retry, Cancel, Approve, ...): confirm with a reason, act, go
    back. Approve and Reject of a call that declares what the customer is told ask for it too,
    and act only once the operator confirmed a preview of those words."""
    chosen = VERBS[verb]
    if not model_admin.may(request, chosen):
        raise PermissionDenied
    if request.method not in ("GET", "POST"):
        return HttpResponseNotAllowed(["GET", "POST"])
    run_id = unquote(object_id).replace("\x00", "")  # Postgres text cannot hold NUL
    run = WorkflowRun.objects.filter(pk=run_id).values(*RUN_SUMMARY).first()
    if run is None or run_id != unquote(object_id):
        messages.warning(request, f"There is no workflow run “{run_id}” to {verb}.")
        return HttpResponseRedirect(reverse("admin:agentflow_workflowrun_changelist"))
    back = HttpResponseRedirect(
        reverse("admin:agentflow_workflowrun_change", args=(quote(run_id),))
    )
    data = request.POST if request.method == "POST" else None
    if chosen.permission != "approve":
        form = ReasonForm(data)
        if form.is_valid():
            perform(request, chosen, [run], form.cleaned_data["reason"])
            return back
        return confirmation(model_admin, request, chosen, [run], form, from_list=False)
    found = WorkflowRun.objects.get(pk=run_id)
    pending = approvals.pending_call(found, privacy.for_run(request, found))
    if pending is None and request.method == "GET":
        messages.warning(request, f"Run {run_id} waits for no approval now.")
        return back
    editing = data is not None and "edit" in data  # back from the preview, to change it
    decision = DecisionForm(
        None if editing else data,
        initial=data.dict() if editing and data is not None else None,
        replies=_replies(found, pending),
        approved=chosen is APPROVE,
    )
    if decision.ready:
        # The call the page showed, named by its digest: a call replaced since (or a POST that
        # names none) is refused, never decided unseen.
        digest = request.POST.get("digest", "")
        reason = decision.cleaned_data["reason"]
        perform(request, chosen, [run], reason, digest=digest, reply=decision.reply_text)
        return back
    preview = decision.reply_text if decision.is_valid() else None
    return confirmation(
        model_admin,
        request,
        chosen,
        [run],
        decision,
        from_list=False,
        pending=pending,
        preview=preview,
    )


def _replies(run: WorkflowRun, pending: dict[str, Any] | None) -> Replies | None:
    """What the waiting call declares its decision may tell the customer."""
    definition = registry.lookup(run.workflow, run.version)
    if pending is None or definition is None:
        return None
    return definition.replies_of(pending["call"])


def confirmation(
    model_admin: ModelAdmin[Any],
    request: HttpRequest,
    verb: Verb,
    runs: list[dict[str, Any]],
    form: ReasonForm,
    *,
    from_list: bool,
    pending: dict[str, Any] | None = None,
    preview: str | None = None,
) -> TemplateResponse:
    """The page that asks for the reason before anything happens."""
    labels = dict(RunStatus.choices)
    count = len(runs)
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"{verb.label} {count} workflow runs?" if count > 1 else f"{verb.label} this run?",
        "subtitle": None,
        "opts": model_admin.opts,
        "verb": verb,
        "runs": [{**run, "badge": badge(run["status"], labels[run["status"]])} for run in runs],
        "form": form,
        "from_list": from_list,
        "action_name": f"{verb.name}_runs",
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "af_pending": pending,
        #: The words the customer will be told, shown before the operator confirms them.
        "af_preview": preview,
        "media": model_admin.media,
    }
    return TemplateResponse(request, CONFIRMATION_TEMPLATE, context)
