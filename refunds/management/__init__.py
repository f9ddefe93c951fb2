"""Management commands of the refunds app."""

from __future__ import annotations
