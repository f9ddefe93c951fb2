"""Template filters for the operator's pages."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import template

register = template.Library()


@register.filter
def thousands(value: Any) -> str:
    """12345 -> "12,345" (figures of tokens and counts); anything else as it is."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return "" if value is None else str(value)


@register.filter
def dollars(value: Any) -> str:
    """A cost: Decimal("0.00021") -> "$0.00021", Decimal(2) -> "$2.00"; None -> "unknown"
    (a model without a price is never shown as free). Cents at least, to the millionth."""
    if value is None:
        return "unknown"
    text = f"{Decimal(value):,.6f}".rstrip("0")
    whole, _, cents = text.partition(".")
    return f"${whole}.{cents.ljust(2, '0')}"


@register.filter
def plural(count: Any, word: str) -> str:
    """`3|plural:"model turn"` -> "3 model turns"."""
    number = count if isinstance(count, int) else len(count)
    return f"{number:,} {word}{'' if number == 1 else 's'}"
