"""/metrics' bearer token check answers yes or no for any header a client can send."""

from __future__ import annotations

import pytest
from django.test import override_settings

from agentflow._observe import metrics


@pytest.mark.parametrize(
    ("header", "allowed"),
    [
        ("Bearer s3cret", True),
        ("bearer s3cret ", True),
        ("Bearer s3cre", False),
        ("Bearer \u00ff\u00fe\u00e9", False),  # what gunicorn makes of bytes that are not ASCII
        ("Bearer \u0663\u00e9", False),
        ("Bearer \udc80", False),  # a lone surrogate: no server sends one, a test client may
        ("Bearer \x00", False),
        ("Bearer " + "x" * 100_000, False),
        ("", False),
    ],
)
def test_authorized__any_header__yes_or_no_never_an_error(header: str, allowed: bool) -> None:
    with override_settings(AGENTFLOW_METRICS_TOKEN="s3cret"):
        assert metrics.authorized(header) is allowed
