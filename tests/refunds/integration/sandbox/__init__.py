"""Tests of the partner sandbox against a real sandbox process."""

from __future__ import annotations
