"""What of a refund is the customer's own, and whose (docs/privacy.md).

A refund run's subject is the customer, named by the e-mail they typed (lower-cased): erasing
that address erases their requests and every run made for them. The fields are those of the
runs' inputs, outputs and arguments that hold the customer's address, name or words.
"""

from __future__ import annotations

from typing import Any

from django.utils.crypto import salted_hmac

from agentflow import durable

#: The keys of what the refund workflows store that hold the customer's details: the input's
#: subject, the booking's contact and passenger (`fetch_booking`), what the parser kept of their
#: message, a waiver's own words (the operator's approval arguments).
FIELDS = (
    "customer",
    "contact_email",
    "customer_email",
    "passenger_name",
    "passenger_last_name",
    "summary",
    "notes",
    "details",
)
#: An agent run also keeps its conversation, whose messages and the model's tool calls may
#: quote any of the above.
AGENT_FIELDS = (*FIELDS, "content", "function.arguments")


def customer(input: Any) -> str:
    """The subject of a refund run: its customer's e-mail (an older run's request id)."""
    return str(input.get("customer") or input["refund_id"]).strip().lower()


REFUND = durable.Personal(subject=customer, fields=FIELDS)
REFUND_AGENT = durable.Personal(subject=customer, fields=AGENT_FIELDS)


def email_digest(email: str) -> str:
    """What the per-e-mail limits and the admin's search look an address up by: the request's
    own column is sealed (and every sealing differs), so it matches nothing. SHA-1 said
    outright (Django 6.1 warns that its default becomes SHA-256): the digests already stored
    must keep matching; as an HMAC it is still sound."""
    return salted_hmac("refunds.email", email.strip().lower(), algorithm="sha1").hexdigest()
