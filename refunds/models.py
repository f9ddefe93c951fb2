"""What the customer asked for. Progress lives in the workflow run, looked up by its id."""

from __future__ import annotations

import secrets

from django.db import models

from agentflow import durable


def new_public_id() -> str:
    """128 random bits: the status page URL is the only key a customer holds."""
    return f"rf_{secrets.token_urlsafe(16)}"


class RefundRequest(models.Model):
    public_id = models.CharField(max_length=40, unique=True, default=new_public_id, editable=False)
    #: As typed: the address the ownership check compares with the booking's contact e-mail.
    #: Mail goes only to the contact e-mail on file, never to this one unless they match.
    #: Sealed under the customer's key (refunds.privacy, docs/privacy.md), as are the name and
    #: words below: looked up by `email_digest`, never by the column.
    email = durable.PersonalTextField(subject="email")
    email_digest = models.CharField(max_length=64, default="", editable=False)
    booking_reference = models.CharField(max_length=6)
    #: The passenger's last name as typed, compared with the booking's (refunds.ownership).
    last_name = durable.PersonalTextField(subject="email", default="")
    message = durable.PersonalTextField(subject="email", max_length=5000)
    #: A fee waiver asked for: one of `refunds.policy.WAIVER_REASONS` ("" for none), and the
    #: customer's few words about it, which the operator deciding on it reads.
    waiver_reason = models.CharField(max_length=20, blank=True, default="")
    waiver_details = durable.PersonalTextField(
        subject="email", max_length=1000, blank=True, default=""
    )
    #: The form's one-time token: the same token always maps to this one request.
    submission_token = models.CharField(max_length=64, unique=True)
    #: The key the per-address limit counts: the client's IPv4 address, or its IPv6 /64
    #: (refunds.proxies), never more of the address than the limit needs.
    client_ip = models.GenericIPAddressField(null=True, blank=True)
    #: The agentflow run doing the work (`wf_…`).
    workflow_id = models.CharField(max_length=40, unique=True, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        permissions = [("cancel_flight", "Can cancel a flight in the sandbox airline")]
        indexes = [
            # Serves the per-e-mail submission limit, which ignores case.
            models.Index(fields=["email_digest", "created_at"], name="refund_email_digest_created"),
            models.Index(fields=["client_ip", "created_at"], name="refund_ip_created"),
            # Serves the per-booking limit.
            models.Index(fields=["booking_reference", "created_at"], name="refund_booking_created"),
        ]

    def __str__(self) -> str:
        return f"{self.public_id} ({self.booking_reference})"
