"""Where subject keys live (docs/privacy.md, "Backups and restores").

`AGENTFLOW_KEYSTORE_DATABASE` names the Django database holding the `agentflow_subjectkey`
table: "default" (the default) keeps it beside the runs; a database of its own, backed up apart,
lets a restored copy of the data stay erased. A host that separates it lists
`agentflow.routers.KeystoreRouter` in `DATABASE_ROUTERS`, so `migrate` creates that table there
and nowhere else.
"""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS

from agentflow._conf import settings

#: The keystore's one model (`agentflow._privacy.models.SubjectKey`), as routers name it.
KEYSTORE_MODEL = "subjectkey"
#: What a host lists in DATABASE_ROUTERS.
ROUTER = "agentflow.routers.KeystoreRouter"


def keystore_database() -> str:
    """The alias every read and write of a subject key goes to."""
    return str(settings.AGENTFLOW_KEYSTORE_DATABASE)


def keystore_apart() -> bool:
    return keystore_database() != DEFAULT_DB_ALIAS


def _is_keystore(app_label: str, model_name: str | None) -> bool:
    return app_label == "agentflow" and model_name == KEYSTORE_MODEL


class KeystoreRouter:
    """Subject keys read and written in the keystore database; with it apart, `migrate` makes
    their table there alone, and the keystore database holds nothing else."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        meta = model._meta
        return keystore_database() if _is_keystore(meta.app_label, meta.model_name) else None

    db_for_write = db_for_read

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool | None:
        if not keystore_apart():
            return None
        keys = _is_keystore(app_label, model_name)
        if db == keystore_database():
            return keys
        return False if keys else None
