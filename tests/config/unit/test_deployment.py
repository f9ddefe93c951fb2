"""The production shape's guards: the secret key, the proxy SSL header, the proxy list."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from config import deployment

STRONG = "k" * 20 + "Q7x-Z_9pL2mN4vB6cD8fG0hJ1sT3wY5r"


@pytest.mark.parametrize("value", [None, "", "   "])
def test_secret_key__missing_with_debug_off_refuses_with_the_reason(monkeypatch, value) -> None:
    if value is None:
        monkeypatch.delenv("DJANGO_SECRET_KEY", raising=False)
    else:
        monkeypatch.setenv("DJANGO_SECRET_KEY", value)
    with pytest.raises(ImproperlyConfigured, match=r"DJANGO_SECRET_KEY is not set.*refusing"):
        deployment.secret_key(debug=False)


@pytest.mark.parametrize(
    "value",
    [deployment.DEBUG_SECRET_KEY, "change-me-in-production", "django-insecure-abc123"],
)
def test_secret_key__published_with_debug_off_refuses(monkeypatch, value: str) -> None:
    monkeypatch.setenv("DJANGO_SECRET_KEY", value)
    with pytest.raises(ImproperlyConfigured, match="published default"):
        deployment.secret_key(debug=False)


def test_secret_key__a_real_one_is_used(monkeypatch) -> None:
    monkeypatch.setenv("DJANGO_SECRET_KEY", STRONG)
    assert deployment.secret_key(debug=False) == STRONG


def test_secret_key__debug_on_falls_back_to_the_debug_key(monkeypatch) -> None:
    monkeypatch.delenv("DJANGO_SECRET_KEY", raising=False)
    assert deployment.secret_key(debug=True) == deployment.DEBUG_SECRET_KEY


def test_proxy_ssl_header__header_and_value() -> None:
    assert deployment.proxy_ssl_header("X-Forwarded-Proto: https") == (
        "HTTP_X_FORWARDED_PROTO",
        "https",
    )
    assert deployment.proxy_ssl_header("") is None


@pytest.mark.parametrize("raw", ["X-Forwarded-Proto", ": https", "X-Forwarded-Proto:"])
def test_proxy_ssl_header__bad_value_refuses(raw: str) -> None:
    with pytest.raises(ImproperlyConfigured, match="DJANGO_SECURE_PROXY_SSL_HEADER"):
        deployment.proxy_ssl_header(raw)


def test_trusted_proxies__bad_value_refuses_naming_the_variable() -> None:
    assert deployment.trusted_proxies(" 1 ") == "1"
    with pytest.raises(ImproperlyConfigured, match="AGENTFLOW_TRUSTED_PROXIES: 'proxy'"):
        deployment.trusted_proxies("proxy")


@pytest.mark.parametrize("weak", ["password", "12345678", "short"])
def test_password_validators__refuse_weak_admin_passwords(weak: str) -> None:
    from django.contrib.auth.password_validation import validate_password
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError):
        validate_password(weak)
    validate_password("a-long-operator-passphrase")
