"""The partner's own record, apart from the engine's rows: every call it got, and each
shipment once per idempotency key."""

from __future__ import annotations

from django.db import models


class PartnerCall(models.Model):
    key = models.CharField(max_length=120)
    at = models.DateTimeField(auto_now_add=True)


class Shipment(models.Model):
    key = models.CharField(max_length=120, unique=True)
    order = models.PositiveIntegerField()


class Release(models.Model):
    """The test's switch for a task that waits to be let go (tests/host: orders/tasks.py)."""

    result_id = models.CharField(max_length=64, unique=True)
