"""The run list's side filters that Django cannot build cheaply by itself."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from agentflow import registry
from agentflow.states import ACTIVE_RUN_STATUSES


class WorkflowFilter(admin.SimpleListFilter):
    """Choices come from the registry: a DISTINCT over the runs table would read every row."""

    title = "workflow"
    parameter_name = "workflow"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in registry.names()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(workflow=self.value()) if self.value() else queryset


class WakeFilter(admin.SimpleListFilter):
    """Overdue = active and past its wake-up time: what the sweeper has yet to pick up."""

    title = "wake-up"
    parameter_name = "wake"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("overdue", "Overdue (sweeper backlog)"), ("scheduled", "Scheduled")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "overdue":
            return queryset.filter(status__in=ACTIVE_RUN_STATUSES, wake_at__lt=timezone.now())
        if self.value() == "scheduled":
            return queryset.filter(status__in=ACTIVE_RUN_STATUSES, wake_at__gte=timezone.now())
        return queryset
