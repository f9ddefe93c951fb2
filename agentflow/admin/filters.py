"""The run list's side filters that Django cannot build cheaply by itself."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest
from django.utils import timezone

from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus, WaitKind
from agentflow._core import registry
from agentflow.models import RunWait


class WorkflowFilter(admin.SimpleListFilter):
    """Choices come from the registry: a DISTINCT over the runs table would read every row."""

    title = "workflow"
    parameter_name = "workflow"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in registry.names()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(workflow=self.value()) if self.value() else queryset


class WakeFilter(admin.SimpleListFilter):
    """Overdue = active and past its wake-up time: what the sweeper has yet to pick up; and the
    runs that wait for an operator's approval."""

    title = "wake-up"
    parameter_name = "wake"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("overdue", "Overdue (sweeper backlog)"),
            ("scheduled", "Scheduled"),
            ("approval", "Waiting for approval"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "overdue":
            return queryset.filter(status__in=ACTIVE_RUN_STATUSES, wake_at__lt=timezone.now())
        if self.value() == "approval":
            waits = RunWait.objects.filter(
                run=OuterRef("pk"),
                branch=OuterRef("branch"),
                seq=OuterRef("current_seq"),
                kind=WaitKind.APPROVAL,
                resolved_at__isnull=True,
            )
            return queryset.filter(Exists(waits), status=RunStatus.WAITING)
        if self.value() == "scheduled":
            return queryset.filter(status__in=ACTIVE_RUN_STATUSES, wake_at__gte=timezone.now())
        return queryset
