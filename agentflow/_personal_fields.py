"""A host's own text columns of a person's data, sealed with the engine's subject keys
(docs/privacy.md, "Declaring what is personal"): erased with the person's runs."""

from __future__ import annotations

from typing import Any

from django.db import models

from agentflow import store
from agentflow._privacy import envelope, keystore


class PersonalTextField(models.TextField):
    """A text column sealed under the key of the subject another field of the same row names
    (`subject="email"`, lower-cased), and opened as it is read ("erased" once erased).

    Sealed on save, so a row keeps its clear text in memory; a lookup on the column matches
    nothing (each sealing is different): look rows up by another field, or a digest."""

    def __init__(self, *args: Any, subject: str = "", **kwargs: Any) -> None:
        self.subject = subject
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        kwargs["subject"] = self.subject
        return name, path, args, kwargs

    def pre_save(self, model_instance: Any, add: bool) -> Any:
        value = super().pre_save(model_instance, add)
        subject = str(getattr(model_instance, self.subject or self.attname) or "").strip().lower()
        if not isinstance(value, str) or not value or not subject or not keystore.enabled():
            return value
        if envelope.is_sealed_text(value):
            return value
        return envelope.seal_text(store.subject_key_for(subject), value)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        return envelope.open_text(value) if isinstance(value, str) else value
