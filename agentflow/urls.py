"""Root URLconf."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from agentflow import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", views.metrics, name="metrics"),
    path("refunds/", include("refunds.urls")),
]
