"""Read-only admin for refund requests, linking each to the workflow run doing its work."""

from __future__ import annotations

import logging

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from agentflow import durable
from refunds import privacy
from refunds.models import RefundRequest
from refunds.sandbox import cancel

logger = logging.getLogger("refunds.flights")


class CancelFlightForm(forms.Form):
    """What `manage.py sandbox cancel-flight` asks for."""

    flight = forms.RegexField(
        regex=r"^[A-Z]{2}[0-9]{1,4}$",
        max_length=6,
        help_text="e.g. SK1236",
        error_messages={"invalid": "A flight is two capital letters and 1-4 digits, e.g. SK1236."},
    )
    date = forms.DateField(help_text="the day it was to fly, YYYY-MM-DD")
    passengers = forms.IntegerField(min_value=1, max_value=1000, initial=300)


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
    change_list_template = "admin/refunds/refundrequest/change_list.html"
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

    def get_urls(self) -> list[URLPattern]:
        cancel_page = path(
            "cancel-flight/",
            self.admin_site.admin_view(self.cancel_flight_view),
            name="refunds_refundrequest_cancel_flight",
        )
        return [cancel_page, *super().get_urls()]

    def cancel_flight_view(self, request: HttpRequest) -> HttpResponse:
        """The sandbox airline cancels a flight and sends its signed notice, as the command
        does: a refund per passenger follows (docs/refunds.md, "A cancelled flight")."""
        if not request.user.has_perm("refunds.cancel_flight"):
            raise PermissionDenied
        form = CancelFlightForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            flight, day = form.cleaned_data["flight"], form.cleaned_data["date"].isoformat()
            try:
                told = cancel.cancel_flight(flight, day, form.cleaned_data["passengers"])
            except cancel.Refused as refused:
                form.add_error(None, str(refused))
            else:
                logger.info("%s cancelled %s on %s in the sandbox", request.user, flight, day)
                self.message_user(request, told, messages.SUCCESS)
                return redirect("admin:refunds_refundrequest_changelist")
        context = {
            **self.admin_site.each_context(request),
            "title": "Cancel a flight (sandbox airline)",
            "opts": self.model._meta,
            "form": form,
        }
        return TemplateResponse(request, "admin/refunds/refundrequest/cancel_flight.html", context)

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
