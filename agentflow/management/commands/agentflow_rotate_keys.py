"""`manage.py agentflow_rotate_keys [--batch N] [--new-key]`: re-wrap every subject key under
the newest master key (docs/privacy.md, "Rotating the master key")."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError

from agentflow import _store as store
from agentflow._privacy import keys, keystore
from agentflow.management.base import BaseCommand, whole


class Command(BaseCommand):
    help = (
        "Re-wrap subject keys under the first of AGENTFLOW_MASTER_KEYS, in batches, with "
        "progress; stopped, it resumes where it was. Once it reports none left, the older "
        "master keys may be removed from the setting."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--batch",
            type=whole(1),
            default=500,
            help="keys per transaction (default 500)",
        )
        parser.add_argument(
            "--new-key",
            action="store_true",
            help="only print a new 'id:key' entry to put first in AGENTFLOW_MASTER_KEYS",
        )

    def handle(self, *args: Any, batch: int, new_key: bool, **options: Any) -> None:
        if new_key:
            self.stdout.write(keys.new_master_key())
            return
        try:
            master = keys.current_master()
            if master is None:
                raise CommandError("no master key is configured (AGENTFLOW_MASTER_KEYS)")
            total = done = 0
            while True:
                moved, left = store.subject_keys_rewrap(batch)
                done += moved
                total = total or done + left  # the count when it (re)started
                self.stdout.write(f"re-wrapped {done} of {total} under {master.id}; {left} left")
                if left == 0 or moved == 0:
                    break
        except keys.MasterKeyError as exc:
            raise CommandError(str(exc)) from None
        if left:
            raise CommandError(f"{left} key(s) are locked by another rotation: run it again")
        by = ", ".join(f"{k}: {n}" for k, n in sorted(keystore.wrapped_by().items())) or "none"
        self.stdout.write(f"done: every live key is wrapped by {master.id} ({by})")
