"""A run's place in a tree of runs (docs/console.md, "Runs that start runs"): the run that
started it, one click away, and the runs it started counted by status, each count one click
from the list of those runs."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from agentflow import _store as store
from agentflow._base.states import RunStatus
from agentflow.models import WorkflowRun


def family(run: WorkflowRun) -> str:
    """ "parent <id> (at step N)" and "children: 280 completed · 20 running" as links."""
    parts = []
    if run.parent_id:
        url = reverse("admin:agentflow_workflowrun_change", args=(quote(run.parent_id),))
        parts.append(
            format_html(
                'started by <a href="{}">{}</a> (its step {})', url, run.parent_id, run.parent_seq
            )
        )
    counts = store.children_counts(run.id)
    if counts:
        listing = reverse("admin:agentflow_workflowrun_changelist")
        counted = format_html_join(
            " · ",
            '<a href="{}?{}">{} {}</a>',
            (
                (
                    listing,
                    urlencode({"parent": run.id, "status": status}),
                    n,
                    RunStatus(status).label.lower(),
                )
                for status, n in sorted(counts.items())
            ),
        )
        every = f"{listing}?{urlencode({'parent': run.id})}"
        parts.append(
            format_html(
                'started <a href="{}">{} runs</a>: {}', every, sum(counts.values()), counted
            )
        )
    return format_html_join(" — ", "{}", ((part,) for part in parts)) if parts else "—"


class ParentFilter(admin.SimpleListFilter):
    """The runs one run started (`?parent=<run id>`): reached from its page, never listed (a
    choice per parent would read every row)."""

    title = "started by"
    parameter_name = "parent"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        return [(value, value)] if value else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(parent_id=self.value()) if self.value() else queryset
