"""Model fields whose stored text or JSON may hold envelopes, opened as they are read."""

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
        if isinstance(value, str | bytes) and not envelope.maybe_sealed(value):
            return super().from_db_value(value, expression, connection)
        return envelope.open_value(super().from_db_value(value, expression, connection))


class PersonalTextField(models.TextField):
    """A text column of a person's data, sealed under the key of the subject another field of
    the same row names (`subject="email"`), and opened as it is read.

    Sealed on save, so a row keeps its clear text in memory; a lookup on the column matches
    nothing (each sealing is different): look rows up by another field, or a digest."""

    def __init__(self, *args: Any, subject: str = "", **kwargs: Any) -> None:
        self.subject = subject
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        kwargs["subject"] = self.subject
        return name, path, args, kwargs

    def pre_save(self, model_instance: models.Model, add: bool) -> Any:
        value = super().pre_save(model_instance, add)
        subject = str(getattr(model_instance, self.subject or self.attname) or "").strip().lower()
        if not isinstance(value, str) or not subject or envelope.is_sealed_text(value):
            return value
        return envelope.seal_text(subject, value)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        return envelope.open_text(value) if isinstance(value, str) else value
