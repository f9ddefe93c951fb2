"""The engine's JSON model field: a run's personal fields sealed in, envelopes opened out."""

from __future__ import annotations

from typing import Any

from django.db import models

from agentflow._privacy import envelope
from agentflow._privacy.scope import seal_stored


class SealedJSONField(models.JSONField):
    """A JSONField of an engine table: what a run's scope declares personal is sealed on the
    way in; envelopes are opened on the way out (ERASED once their key is gone)."""

    def get_prep_value(self, value: Any) -> Any:
        return super().get_prep_value(seal_stored(value))

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        found = super().from_db_value(value, expression, connection)
        if isinstance(value, str) and not envelope.maybe_sealed(value):
            return found  # the common case: one substring test, no walk
        return envelope.open_value(found)
