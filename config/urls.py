"""This site's URLconf: the refund pages, the admin console, and agentflow's health and metrics."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

# Django's stock 400 page re-reads a body it could not decode and fails again (a 500); the
# refunds app renders a friendly one without touching the body.
handler400 = "refunds.views.bad_request"

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="refunds:new", permanent=False)),
    path("admin/", admin.site.urls),
    path("", include("agentflow.urls")),  # /healthz and /metrics, where probes look for them
    path("refunds/", include("refunds.urls")),
]
