"""`manage.py agentflow_erase --subject S --reason R [--actor A] [--cancel-in-flight]`: erase one
person's personal data from every run (docs/privacy.md, "Erasure"), keeping the runs.
`manage.py agentflow_erase --replay`: after a restore, every journaled erasure applied to the
keystore again (docs/privacy.md, "Backups and restores")."""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import CommandError

from agentflow import _erasure
from agentflow import _store as store
from agentflow.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "Destroy SUBJECT's keys: their personal fields read 'erased' in every run, copy and "
        "backup, while the runs, their steps and amounts stay. Refused while a run of theirs "
        "is in flight. --replay, after a restore: apply every journaled erasure again."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--subject", help="whose data, as the workflow's Personal names it")
        parser.add_argument("--reason", default="", help="why (recorded, e.g. a ticket)")
        parser.add_argument("--actor", default="", help="who asked (default: this shell's user)")
        parser.add_argument(
            "--cancel-in-flight",
            action="store_true",
            help="cancel the subject's runs in flight (their compensations run); erase again "
            "once they have ended",
        )
        parser.add_argument(
            "--replay",
            action="store_true",
            help="after restoring the keystore (or the data) from a backup: erase again every "
            "key the erasure journal names, and journal every tombstone it lacks",
        )

    def handle(
        self,
        *args: Any,
        subject: str | None,
        reason: str,
        actor: str,
        cancel_in_flight: bool,
        replay: bool,
        **options: Any,
    ) -> None:
        if replay:
            if subject is not None:
                raise CommandError("--replay erases what the journal names: give no --subject")
            replayed = store.erasures_replay()
            self.stdout.write(
                f"replayed {replayed.erasures} journaled erasure(s): {replayed.erased_now} "
                f"key(s) erased again; {replayed.journaled_now} erasure(s) journaled from the "
                "keystore"
            )
            return
        try:
            done = _erasure.erase(
                subject or "",
                actor=actor or f"shell:{getpass.getuser()}",
                reason=reason,
                cancel_in_flight=cancel_in_flight,
            )
        except _erasure.ErasureRefused as exc:
            raise CommandError(f"not erased: {exc}") from None
        if not done.keys:
            self.stdout.write("nothing to erase: no live key for that subject")
            return
        self.stdout.write(f"erased: {done.keys} key(s) destroyed; {done.runs} run(s) kept")
