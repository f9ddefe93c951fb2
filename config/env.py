"""Typed reads of environment variables that fail loudly on a bad value."""

from __future__ import annotations

import math
import os

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(key: str, default: str) -> str:
    """Return the variable, or `default` when it is unset or empty."""
    return os.environ.get(key) or default


def env_int(key: str, default: int, *, minimum: int = 0) -> int:
    raw = os.environ.get(key)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{key} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{key} must be at least {minimum}, got {value}")
    return value


def env_float(key: str, default: float, *, minimum: float | None = 0.0) -> float:
    """A finite number; at least `minimum` unless that is None."""
    raw = os.environ.get(key)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{key} must be a number, got {raw!r}") from None
    if not math.isfinite(value):
        raise ImproperlyConfigured(f"{key} must be a finite number, got {raw!r}")
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{key} must be at least {minimum:g}, got {value:g}")
    return value


def env_bool(key: str, default: bool) -> bool:
    raw = os.environ.get(key)
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{key} must be one of 1/0/true/false/yes/no/on/off, got {raw!r}")


def env_list(key: str, default: list[str]) -> list[str]:
    raw = os.environ.get(key)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]
