"""Clients for the sandbox tests: the real `stripe` library and raw HTTP, aimed at the sandbox."""

from __future__ import annotations

from typing import Any

import requests
import stripe

API_KEY = "sk_test_sandbox_tests"
STRIPE_AUTH = {"Authorization": f"Bearer {API_KEY}"}


def make_stripe_client(url: str, *, max_network_retries: int = 2) -> stripe.StripeClient:
    """The client as the gateways build it: library retries on, a short timeout."""
    return stripe.StripeClient(
        API_KEY,
        base_addresses={"api": url},
        max_network_retries=max_network_retries,
        http_client=stripe.RequestsClient(timeout=10),
    )


def intent_params(workflow_id: str = "wf-1", amount: int = 4500, **extra: Any) -> dict[str, Any]:
    return {
        "amount": amount,
        "currency": "usd",
        "payment_method": "pm_card_visa",
        "confirm": True,
        "description": "rebooking fee",
        "metadata": {"workflow_id": workflow_id},
        **extra,
    }


def raw_create_intent(url: str, key: str | None, *, amount: str = "4500") -> requests.Response:
    """One POST with no client-side retries, to observe single answers (409, 400)."""
    headers = dict(STRIPE_AUTH)
    if key is not None:
        headers["Idempotency-Key"] = key
    form = {
        "amount": amount,
        "currency": "usd",
        "payment_method": "pm_card_visa",
        "confirm": "true",
        "metadata[workflow_id]": "wf-raw",
    }
    return requests.post(f"{url}/v1/payment_intents", data=form, headers=headers, timeout=10)
