"""The production shape's guards: a real secret key, HTTPS settings, the trusted-proxy list.

Read once by settings, so that a process started wrongly stops at once with the reason
(gunicorn, runserver, celery worker and beat all load settings first) rather than serving with
a key that anyone can read in this repository.
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

from refunds.proxies import parse_trusted_proxies

#: Signs sessions and form tokens under DJANGO_DEBUG=1 only; refused with DEBUG off.
DEBUG_SECRET_KEY = "dev-only-insecure-key-change-me-in-production"
#: Keys that were ever published with this project (defaults, examples): never secret.
PUBLISHED_SECRET_KEYS = frozenset(
    {DEBUG_SECRET_KEY, "change-me-in-production", "change-me", "build", "secret", "changeme"}
)
_GENERATE = "python -c 'import secrets; print(secrets.token_urlsafe(50))'"


def secret_key(*, debug: bool) -> str:
    """DJANGO_SECRET_KEY, or the debug key when DEBUG is on and none is set.

    Raises:
        ImproperlyConfigured: DEBUG is off and the key is missing or a published one.
    """
    key = os.environ.get("DJANGO_SECRET_KEY", "").strip()
    published = key in PUBLISHED_SECRET_KEYS or key.startswith("django-insecure-")
    if key and not published:
        return key
    if debug:
        return key or DEBUG_SECRET_KEY
    problem = "is not set" if not key else "is a published default, not a secret"
    raise ImproperlyConfigured(
        f"DJANGO_SECRET_KEY {problem}, and DJANGO_DEBUG is off: refusing to start. "
        f"Set DJANGO_SECRET_KEY to a long random value (for example: {_GENERATE}), "
        "or DJANGO_DEBUG=1 on a developer machine."
    )


def proxy_ssl_header(raw: str) -> tuple[str, str] | None:
    """'X-Forwarded-Proto: https' as Django's SECURE_PROXY_SSL_HEADER; '' is None.

    Raises:
        ImproperlyConfigured: not 'Header-Name: value'.
    """
    if not raw.strip():
        return None
    name, sep, value = raw.partition(":")
    if not sep or not name.strip() or not value.strip():
        raise ImproperlyConfigured(
            f"DJANGO_SECURE_PROXY_SSL_HEADER must look like 'X-Forwarded-Proto: https', got {raw!r}"
        )
    meta_name = "HTTP_" + name.strip().upper().replace("-", "_")
    return meta_name, value.strip()


def trusted_proxies(raw: str) -> str:
    """AGENTFLOW_TRUSTED_PROXIES checked now (a bad value stops the start), kept as text.

    Raises:
        ImproperlyConfigured: neither a count nor a list of addresses/networks.
    """
    try:
        parse_trusted_proxies(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"AGENTFLOW_TRUSTED_PROXIES: {exc}") from None
    return raw.strip()
