"""The refund domain app: the customer form, the refund workflow, partner clients, sandbox."""

from __future__ import annotations

from django.apps import AppConfig


class RefundsConfig(AppConfig):
    name = "refunds"
    verbose_name = "Refunds"
    default_auto_field = "django.db.models.BigAutoField"
