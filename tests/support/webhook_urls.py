"""A host's URLconf with agentflow's partner webhook view mounted, as `agentflow.webhooks` tells
a host to mount it."""

from __future__ import annotations

from django.urls import path

from agentflow import webhooks

urlpatterns = [path("hooks/<slug:partner>/", webhooks.signal_webhook)]
