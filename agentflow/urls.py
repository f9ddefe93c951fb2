"""Root URLconf."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from agentflow import views

# Django's stock 400 page re-reads a body it could not decode and fails again (a 500); the
# refunds app renders a friendly one without touching the body.
handler400 = "refunds.views.bad_request"

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="refunds:new", permanent=False)),
    path("admin/", admin.site.urls),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", views.metrics, name="metrics"),
    path("refunds/", include("refunds.urls")),
]
