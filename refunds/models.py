"""What the customer asked for. Progress lives in the workflow run, looked up by its id."""

from __future__ import annotations

import secrets

from django.db import models
from django.db.models.functions import Lower


def new_public_id() -> str:
    """128 random bits: the status page URL is the only key a customer holds."""
    return f"rf_{secrets.token_urlsafe(16)}"


class RefundRequest(models.Model):
    public_id = models.CharField(max_length=40, unique=True, default=new_public_id, editable=False)
    email = models.EmailField()
    booking_reference = models.CharField(max_length=6)
    message = models.TextField(max_length=5000)
    #: The form's one-time token: the same token always maps to this one request.
    submission_token = models.CharField(max_length=64, unique=True)
    client_ip = models.GenericIPAddressField(null=True, blank=True)
    #: The agentflow run doing the work (`wf_…`).
    workflow_id = models.CharField(max_length=40, unique=True, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # Serves the per-e-mail submission limit, which ignores case.
            models.Index(Lower("email"), "created_at", name="refund_email_ci_created"),
            models.Index(fields=["client_ip", "created_at"], name="refund_ip_created"),
        ]

    def __str__(self) -> str:
        return f"{self.public_id} ({self.booking_reference})"
