"""A host's own text columns of a person's data, sealed with the engine's subject keys
(docs/privacy.md, "Declaring what is personal"): erased with the person's runs."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.db import models

from agentflow import _store as store
from agentflow._privacy import envelope, keystore

#: Subjects' key ids read (or made) together beforehand (`personal_keys`), by subject.
_known: ContextVar[dict[str, str] | None] = ContextVar("agentflow_personal_keys", default=None)


@contextmanager
def personal_keys(subjects: Iterable[str]) -> Iterator[None]:
    """Inside, `PersonalTextField` seals these subjects' rows under their keys read, or made,
    together now: many people's rows saved at once (a `bulk_create`) cost a few statements
    rather than one per field and row. Outside a transaction, keys made stay if it fails (a
    key no row uses is harmless); nothing is read without a master key."""
    wanted = {str(s).strip().lower() for s in subjects if str(s).strip()}
    found = store.subject_keys_for_many(wanted) if wanted and keystore.enabled() else {}
    token = _known.set({**(_known.get() or {}), **found})
    try:
        yield
    finally:
        _known.reset(token)


def _key_for(subject: str) -> str:
    known = _known.get()
    if known is not None and subject in known:
        return known[subject]
    return store.subject_key_for(subject)


class PersonalTextField(models.TextField):
    """A text column sealed under the key of the subject another field of the same row names
    (`subject="email"`, lower-cased), and opened as it is read ("erased" once erased).

    Sealed on save, so a row keeps its clear text in memory; a lookup on the column matches
    nothing (each sealing is different): look rows up by another field, or a digest."""

    def __init__(self, *args: Any, subject: str = "", **kwargs: Any) -> None:
        self.subject = subject
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, _, args, kwargs = super().deconstruct()
        kwargs["subject"] = self.subject
        # The public name, so a host's migrations never name a private module of ours.
        return name, "agentflow.durable.PersonalTextField", args, kwargs

    def pre_save(self, model_instance: Any, add: bool) -> Any:
        value = super().pre_save(model_instance, add)
        subject = str(getattr(model_instance, self.subject or self.attname) or "").strip().lower()
        if not isinstance(value, str) or not value or not subject or not keystore.enabled():
            return value
        if envelope.is_sealed_text(value):
            return value
        return envelope.seal_text(_key_for(subject), value)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        return envelope.open_text(value) if isinstance(value, str) else value
