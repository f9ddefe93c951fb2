"""The admin's erasure page (docs/privacy.md, "Erasure"): erase one person's personal data under
a permission of its own (`agentflow.erase_subjectkey`), recorded with the operator and the
reason, and the record of past erasures. Nothing here ever shows a person's data or subject:
the page lists keys by their random ids, and the subject typed is never echoed back."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from agentflow import _erasure
from agentflow.admin.forms import ReasonForm
from agentflow.admin.pages import ActionsOnlyAdmin
from agentflow.models import SubjectKey

ERASE_PERMISSION = "agentflow.erase_subjectkey"
#: Past erasures shown.
RECENT = 100


class EraseForm(ReasonForm):
    subject = forms.CharField(
        max_length=1000,
        strip=True,
        help_text="Whose data: as the workflow names its subject (for refunds, the e-mail).",
        widget=forms.TextInput(attrs={"autocomplete": "off", "size": 50}),
    )
    cancel_in_flight = forms.BooleanField(
        required=False,
        help_text="Cancel their runs still in flight (compensations run); erase once ended.",
    )


@admin.register(SubjectKey)
class SubjectKeyAdmin(ActionsOnlyAdmin):
    change_list_template = "admin/agentflow/subjectkey/erasure.html"

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(ERASE_PERMISSION)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(ERASE_PERMISSION)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not request.user.has_perm(ERASE_PERMISSION):
            raise PermissionDenied
        form = EraseForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            self._erase(request, form.cleaned_data)
            return HttpResponseRedirect(reverse("admin:agentflow_subjectkey_changelist"))
        erased = SubjectKey.objects.filter(erased_at__isnull=False).order_by("-erased_at")
        context = {
            **self.admin_site.each_context(request),
            "title": "Erase a person's data",
            "opts": self.opts,
            "form": form,
            "erasures": list(erased[:RECENT]),
        }
        return TemplateResponse(request, self.change_list_template, context)

    def _erase(self, request: HttpRequest, data: dict[str, Any]) -> None:
        try:
            done = _erasure.erase(
                data["subject"],
                actor=request.user.get_username(),
                reason=data["reason"],
                cancel_in_flight=data["cancel_in_flight"],
            )
        except _erasure.ErasureRefused as exc:
            messages.error(request, f"Not erased: {exc}.")
            return
        if done.keys:
            messages.success(
                request, f"Erased: {done.keys} key(s) destroyed; {done.runs} run(s) kept."
            )
        else:
            messages.warning(request, "Nothing to erase: no live key for that subject.")
