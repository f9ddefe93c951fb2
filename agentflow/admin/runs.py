"""The workflow run admin: a read-only list and detail page with a timeline (and, for agent
runs, the conversation), plus Retry, Resume now, Cancel and Fork, and Approve / Reject of a call
that waits for approval.

Engine rows are never edited here (procrastinate's and django-celery-results' shape): the
only writes are the operator actions in `agentflow.admin.actions` and `forking`, which go
through the store.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from agentflow import _store as store
from agentflow._base.states import TERMINAL_RUN_STATUSES, RunStatus
from agentflow._builds import routing
from agentflow._core import builds, links, registry
from agentflow.admin import actions as run_actions
from agentflow.admin import approvals, family, forking, privacy, run_page, signals
from agentflow.admin.counting import EstimatingPaginator, bounded_count
from agentflow.admin.dashboard import dashboard
from agentflow.admin.dates import date_hierarchy
from agentflow.admin.display import ago, badge, pretty, wake_up, when
from agentflow.admin.filters import WakeFilter, WorkflowFilter
from agentflow.admin.forms import ReasonForm
from agentflow.admin.inlines import EventInline, StepInline
from agentflow.models import StepCheckpoint, WorkflowRun

RUN_FIELDS = (
    "id",
    "definition",
    "status_badge",
    "current",
    "current_attempts",
    "business_key_block",
    "related",
    "family_block",
    "wake_up",
    "created",
    "updated",
    "build_block",
)
PAYLOAD_FIELDS = ("error_block", "output_block", "input_block", "compensations_block")
WAIT_FIELDS = ("pending_block", "waits_block", "signals_block")


@admin.register(WorkflowRun)
class WorkflowRunAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "definition",
        "status_badge",
        "current",
        "current_attempts",
        "created",
        "updated",
        "wake_up",
    )
    list_display_links = ("id",)
    list_filter = ("status", WorkflowFilter, WakeFilter, family.ParentFilter)
    #: Only orderings an index serves; sorting a million rows by status is never worth it.
    sortable_by = ("created",)
    search_fields = ("=id", "=business_key")
    search_help_text = "A run id (wf_…, or its beginning) or a business key, exactly."
    date_hierarchy = "created_at"
    paginator = EstimatingPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # facet counts are a GROUP BY over every row
    list_per_page = 100
    actions = ("retry_runs", "resume_runs", "cancel_runs")
    inlines = (StepInline, EventInline)
    fieldsets = (
        (None, {"fields": RUN_FIELDS}),
        ("Outcome and input", {"fields": PAYLOAD_FIELDS}),
        ("Waits, decisions and signals", {"fields": WAIT_FIELDS}),
    )
    readonly_fields = RUN_FIELDS + PAYLOAD_FIELDS + WAIT_FIELDS

    # --- read-only: nothing here edits an engine row -----------------------------------------
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_operate_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Retry, Resume now and Cancel belong to whoever holds the model's change permission."""
        return request.user.has_perm("agentflow.change_workflowrun")

    def has_approve_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Approve and Reject belong to holders of `agentflow.approve_workflowrun` alone."""
        return approvals.may_decide(request)

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowRun]:
        # The current step's attempts, through the (run, seq) unique index: one probe per row
        # of the page, inside the same query.
        attempts = StepCheckpoint.objects.filter(
            run=OuterRef("pk"), seq=OuterRef("current_seq")
        ).order_by()
        return (
            super()
            .get_queryset(request)
            .annotate(
                current_step_attempts=Subquery(attempts.values("attempts")[:1]),
                open_wait_kind=approvals.open_wait_kind(),
            )
        )

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[WorkflowRun], search_term: str
    ) -> tuple[QuerySet[WorkflowRun], bool]:
        """Exact matches only, each served by an index (id prefix uses its pattern index)."""
        term = search_term.replace("\x00", "").strip()
        if not term:
            return queryset, False
        match = Q(pk=term) | Q(business_key=term)
        if term.startswith("wf_") and len(term) >= 6:
            match |= Q(pk__startswith=term)
        return queryset.filter(match), False

    # --- columns and fields ------------------------------------------------------------------
    @admin.display(description="workflow")
    def definition(self, run: WorkflowRun) -> str:
        if registry.lookup(run.workflow, run.version) is None:
            return format_html(
                '{} v{} <span class="af-overdue" title="{}">not in this code</span>',
                run.workflow,
                run.version,
                "No definition of this name and version is in this code: the build field "
                "below says whether this build could take the run.",
            )
        return f"{run.workflow} v{run.version}"

    @admin.display(description="build")
    def build_block(self, run: WorkflowRun) -> str:
        """The build it is on, why it waits if a build holds it, and, when it is not on this
        build, whether this build could take it: the first difference as a diff
        (docs/deploys.md, "Builds")."""
        own = builds.current()
        shown = privacy.attached(run)  # a difference quotes the calls: their arguments masked
        parts: list[str] = [
            format_html(
                "<code>{}</code> (started on <code>{}</code>)",
                run.build or "—",
                run.started_build or "—",
            )
        ]
        if run.pinned:
            parts.append(" · pinned: it finishes on its build")
        held = routing.run_reason(run)
        if held:
            parts.append(format_html(' · <span class="af-overdue">{}</span>', held))
        if run.build != own and run.status not in TERMINAL_RUN_STATUSES:
            state = store.state_load(run.id, run.current_seq)
            if state is not None:
                _, check = routing.decide(state)
                if check.safe:
                    parts.append(format_html("<div>this build ({}) can take it</div>", own))
                else:
                    parts.append(
                        format_html(
                            "<div>this build ({}) cannot take it: {}</div><pre>{}</pre>",
                            own,
                            shown.text(check.reason),
                            shown.text(check.diff()),
                        )
                    )
        return format_html_join("", "{}", ((part,) for part in parts))

    @admin.display(description="business key")
    def business_key_block(self, run: WorkflowRun) -> str:
        return privacy.attached(run).text(run.business_key or "") or "—"

    @admin.display(description="related")
    def related(self, run: WorkflowRun) -> str:
        found = privacy.attached(run).links(links.run_links(run_ref(run)))
        if not found:
            return "—"
        return format_html_join(
            " · ", '<a href="{}" title="{}">{}</a>', ((k.url, k.title, k.label) for k in found)
        )

    @admin.display(description="parent and children")
    def family_block(self, run: WorkflowRun) -> str:
        return family.family(run)

    @admin.display(description="status")
    def status_badge(self, run: WorkflowRun) -> str:
        return badge(run.status, approvals.status_label(run))

    @admin.display(description="current step")
    def current(self, run: WorkflowRun) -> str:
        if not run.current_step or run.status == RunStatus.COMPLETED:
            return "—"  # a completed run's counter has moved past its last step
        return f"#{run.current_seq} {run.current_step}"

    @admin.display(description="attempts")
    def current_attempts(self, run: WorkflowRun) -> Any:
        attempts = getattr(run, "current_step_attempts", None)
        return "—" if attempts is None else attempts

    @admin.display(description="created", ordering="created_at")
    def created(self, run: WorkflowRun) -> str:
        return when(run.created_at)

    @admin.display(description="updated")
    def updated(self, run: WorkflowRun) -> str:
        return ago(run.updated_at, timezone.now())

    @admin.display(description="wake-up")
    def wake_up(self, run: WorkflowRun) -> str:
        return wake_up(run, timezone.now())

    @admin.display(description="error")
    def error_block(self, run: WorkflowRun) -> str:
        return pretty(privacy.attached(run).text(run.error), text=True)

    @admin.display(description="output")
    def output_block(self, run: WorkflowRun) -> str:
        return pretty(privacy.attached(run).value(run.output))

    @admin.display(description="input")
    def input_block(self, run: WorkflowRun) -> str:
        return pretty(privacy.attached(run).value(run.input))

    @admin.display(description="waits for approval of")
    def pending_block(self, run: WorkflowRun) -> str:
        pending = approvals.pending_call(run, privacy.attached(run))
        if pending is None:
            return "—"
        return format_html(
            '<code>{}</code>{}<div class="af-key">digest {} · asked {} · rejected if '
            "undecided by {}</div>",
            pending["call"],
            pending["arguments"],
            pending["digest"],
            pending["requested"],
            pending["expires"],
        )

    @admin.display(description="waits and decisions")
    def waits_block(self, run: WorkflowRun) -> str:
        return approvals.waits_block(run, privacy.attached(run))

    @admin.display(description="signals")
    def signals_block(self, run: WorkflowRun) -> str:
        return signals.signals_block(run, privacy.attached(run))

    @admin.display(description="compensations still to run")
    def compensations_block(self, run: WorkflowRun) -> str:
        return pretty(privacy.attached(run).value(run.compensations))

    # --- pages ------------------------------------------------------------------------------
    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if _has_nul(request):  # Postgres rejects NUL in text: refuse here, not with a 500
            messages.warning(request, "Ignored a malformed request.")
            return HttpResponseRedirect(self._changelist_url())
        extra_context = {"title": "Workflow runs", **(extra_context or {})}
        response = super().changelist_view(request, extra_context)
        context = getattr(response, "context_data", None)
        if isinstance(response, TemplateResponse) and context and "cl" in context:
            context["af_dashboard"] = dashboard(timezone.now())
            context["af_dates"] = date_hierarchy(context["cl"])
        return response

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> WorkflowRun | None:
        if "\x00" in object_id:  # not a run id, and Postgres would reject it with an error
            return None
        run = super().get_object(request, object_id, from_field)
        # What this viewer may read of its sensitive arguments, for the field methods below.
        return privacy.attach(run, privacy.for_run(request, run)) if run is not None else None

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: Any = None,
    ) -> HttpResponse:
        if request.method == "POST":  # there is nothing to save: say so instead of a 403
            messages.warning(request, "Workflow runs are read-only here; use Retry or Cancel.")
            return HttpResponseRedirect(request.path if object_id else self._changelist_url())
        return super().changeform_view(request, object_id, form_url, extra_context)

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: WorkflowRun | None = None,
    ) -> HttpResponse:
        if obj is not None:
            context["af_verbs"] = [
                v for v in run_actions.VERBS.values() if self._offers(request, obj, v)
            ]
        if obj is not None:
            shown = privacy.for_run(request, obj)
            context["af_pending"] = approvals.pending_call(obj, shown)
            context["af_error"] = shown.text(obj.error)
            rows = run_page.RunRows.load(obj).shown(shown)
            context["af_timeline"] = run_page.timeline_of(obj, rows)
            context["af_trajectory"] = run_page.trajectory_of(
                obj, rows, may_fork=self.has_operate_permission(request)
            )
        return super().render_change_form(request, context, add, change, form_url, obj)

    def _offers(self, request: HttpRequest, run: WorkflowRun, verb: run_actions.Verb) -> bool:
        """The detail page's buttons: by permission and status; Approve and Reject only while
        the run waits for approval."""
        if not self.may(request, verb) or run.status not in verb.offered_for:
            return False
        if verb.permission == "approve":
            return getattr(run, "open_wait_kind", None) == "approval"
        if verb is run_actions.MOVE:
            return run.build != builds.current()
        return True

    def may(self, request: HttpRequest, verb: run_actions.Verb) -> bool:
        if verb.permission == "approve":
            return self.has_approve_permission(request)
        return self.has_operate_permission(request)

    def get_inline_instances(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        """Inline instances are made per request: the step inline learns its run here, so each
        step's domain links are built without a query per step."""
        inlines = super().get_inline_instances(request, obj)
        for inline in inlines:
            if isinstance(inline, StepInline) and obj is not None:
                inline.run_ref = run_ref(obj)
            if isinstance(inline, StepInline | EventInline) and obj is not None:
                inline.privacy = privacy.for_run(request, obj)
        return inlines

    def get_urls(self) -> list[Any]:
        app, model = self.opts.app_label, self.opts.model_name
        wrap = self.admin_site.admin_view
        own = [
            path(
                f"<path:object_id>/{verb}/",
                wrap(self.run_action_view),
                {"verb": verb},
                name=f"{app}_{model}_{verb}",
            )
            for verb in run_actions.VERBS
        ]
        own.append(
            path(
                "<path:object_id>/fork/",
                wrap(lambda request, object_id: forking.fork_view(self, request, object_id)),
                name=f"{app}_{model}_fork",
            )
        )
        return own + super().get_urls()

    # --- operator actions --------------------------------------------------------------------
    @admin.action(description="Retry selected runs…", permissions=["operate"])
    def retry_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> Any:
        return self._list_action(request, queryset, run_actions.RETRY)

    @admin.action(description="Resume selected runs now…", permissions=["operate"])
    def resume_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> Any:
        return self._list_action(request, queryset, run_actions.RESUME)

    @admin.action(description="Cancel selected runs…", permissions=["operate"])
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> Any:
        return self._list_action(request, queryset, run_actions.CANCEL)

    def _list_action(
        self, request: HttpRequest, queryset: QuerySet[WorkflowRun], verb: run_actions.Verb
    ) -> TemplateResponse | None:
        """First POST (from the list): show the confirmation. Second (`post=yes`): act."""
        limit = run_actions.MAX_RUNS_PER_ACTION
        if bounded_count(queryset, limit) > limit:
            messages.error(
                request, f"Select at most {limit} runs at a time; filter the list first."
            )
            return None
        runs = list(queryset.order_by("-created_at").values(*run_actions.RUN_SUMMARY))
        if not runs:
            messages.warning(request, "None of the selected runs exists any more.")
            return None
        form = ReasonForm(request.POST if request.POST.get("post") == "yes" else None)
        if form.is_valid():
            run_actions.perform(request, verb, runs, form.cleaned_data["reason"])
            return None  # Django redirects back to the list, filters kept
        return run_actions.confirmation(self, request, verb, runs, form, from_list=True)

    def run_action_view(self, request: HttpRequest, object_id: str, verb: str) -> HttpResponse:
        """The detail page's buttons (Retry, Cancel, Approve, ...): see `actions.action_view`."""
        return run_actions.action_view(self, request, object_id, verb)

    def _changelist_url(self) -> str:
        return reverse("admin:agentflow_workflowrun_changelist")


def run_ref(run: WorkflowRun) -> links.RunRef:
    return links.RunRef(
        id=run.pk,
        workflow=run.workflow,
        version=run.version,
        business_key=run.business_key,
        input=run.input,
        status=run.status,
    )


def _has_nul(request: HttpRequest) -> bool:
    return any(
        "\x00" in key or any("\x00" in value for value in values)
        for data in (request.GET, request.POST)
        for key, values in data.lists()
    )
