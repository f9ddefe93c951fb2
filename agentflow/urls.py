"""agentflow's own URLs: `path("agentflow/", include("agentflow.urls"))` in a host's URLconf
serves its health check and Prometheus metrics there."""

from __future__ import annotations

from django.urls import path

from agentflow._engine import views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("metrics", views.metrics, name="metrics"),
]
