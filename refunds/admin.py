"""Read-only admin for refund requests, linking each to the workflow run doing its work."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from agentflow import durable
from refunds import privacy
from refunds.models import RefundRequest


@admin.register(RefundRequest)
class RefundRequestAdmin(admin.ModelAdmin):
    """What the customer asked for is a record, not something to edit: operators act on the
    run (retry, cancel) from its own admin page."""

    list_display = ("public_id", "email", "booking_reference", "created_at", "workflow_link")
    list_display_links = ("public_id",)
    # The e-mail column is sealed (refunds.privacy): an address is found by its digest.
    search_fields = ("booking_reference", "public_id", "workflow_id")
    list_filter = (("created_at", admin.DateFieldListFilter),)
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    list_per_page = 50
    show_full_result_count = False  # a COUNT(*) per page view is wasted on a growing table
    fields = (
        "public_id",
        "created_at",
        "email",
        "booking_reference",
        "last_name",
        "message",
        "waiver_reason",
        "waiver_details",
        "client_ip",
        "workflow_link",
        "run_status",
    )
    readonly_fields = fields

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[RefundRequest], search_term: str
    ) -> tuple[QuerySet[RefundRequest], bool]:
        found, duplicates = super().get_search_results(request, queryset, search_term)
        if "@" in search_term:
            found |= queryset.filter(email_digest=privacy.email_digest(search_term))
        return found, duplicates

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    @admin.display(description="Workflow run", ordering="workflow_id")
    def workflow_link(self, obj: RefundRequest) -> str:
        if not obj.workflow_id:
            return "—"
        return format_html(
            '<a href="{}">{}</a>', workflow_run_url(obj.workflow_id), obj.workflow_id
        )

    @admin.display(description="Run status")
    def run_status(self, obj: RefundRequest) -> str:
        run = durable.snapshot(obj.workflow_id) if obj.workflow_id else None
        if run is None:
            return "—"
        return f"{run.status} at {run.current_step}" if run.current_step else run.status


def workflow_run_url(run_id: str) -> str:
    """The run's admin page (ids are quoted: the admin decodes `_22`-style escapes)."""
    return reverse("admin:agentflow_workflowrun_change", args=[quote(run_id)])
