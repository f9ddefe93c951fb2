"""`manage.py agentflow_erase --subject S --reason R [--actor A] [--cancel-in-flight]`: erase one
person's personal data from every run (docs/privacy.md, "Erasure"), keeping the runs."""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import CommandError

from agentflow import _erasure
from agentflow.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "Destroy SUBJECT's keys: their personal fields read 'erased' in every run, copy and "
        "backup, while the runs, their steps and amounts stay. Refused while a run of theirs "
        "is in flight."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--subject", required=True, help="whose data, as the workflow's Personal names it"
        )
        parser.add_argument("--reason", required=True, help="why (recorded, e.g. a ticket)")
        parser.add_argument("--actor", default="", help="who asked (default: this shell's user)")
        parser.add_argument(
            "--cancel-in-flight",
            action="store_true",
            help="cancel the subject's runs in flight (their compensations run); erase again "
            "once they have ended",
        )

    def handle(
        self, *args: Any, subject: str, reason: str, actor: str, cancel_in_flight: bool,
        **options: Any,
    ) -> None:  # fmt: skip
        try:
            done = _erasure.erase(
                subject,
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
