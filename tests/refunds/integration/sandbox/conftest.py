"""Fixtures for the sandbox tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
import stripe

from tests.refunds.integration.sandbox.clients import make_stripe_client
from tests.support.sandbox import SandboxProcess


@pytest.fixture
def stripe_client(clean_sandbox: SandboxProcess) -> stripe.StripeClient:
    return make_stripe_client(clean_sandbox.url)


@pytest.fixture
def new_key() -> Callable[[str], str]:
    """Unique keys per test, readable in a failing ledger dump."""
    return lambda name: f"{name}-{uuid.uuid4().hex[:8]}"
