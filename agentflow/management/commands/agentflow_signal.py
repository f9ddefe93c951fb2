"""`manage.py agentflow_signal RUN_ID NAME [--payload JSON] [--signal-id ID]`: send a signal to
a run from the shell, as `durable.signal` does (kept until a `wait_for(NAME)` takes it)."""

from __future__ import annotations

import secrets
from typing import Any

from django.core.management.base import CommandError

from agentflow import durable
from agentflow.management.base import BaseCommand, json_argument


class Command(BaseCommand):
    help = (
        "Send signal NAME to run RUN_ID: its wait_for(NAME) takes it, now or when the run gets "
        "there. Exactly once per --signal-id (sending the same id again does nothing)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("run_id", help="the run's id (wf_…)")
        parser.add_argument("name", help="the signal's name, as the run's wait_for names it")
        parser.add_argument("--payload", default="null", help="what the wait gets, as JSON")
        parser.add_argument(
            "--signal-id",
            default=None,
            help="the id that makes it exactly once (default: a new one, printed); send the "
            "same id again to be sure it arrived without it acting twice",
        )

    def handle(
        self,
        *args: Any,
        run_id: str,
        name: str,
        payload: str,
        signal_id: str | None,
        **options: Any,
    ) -> None:
        data = json_argument(payload, "--payload")
        chosen = signal_id if signal_id is not None else f"shell-{secrets.token_hex(8)}"
        try:
            delivery = durable.signal(run_id, name, data, signal_id=chosen)
        except durable.ActionRefused as exc:
            raise CommandError(f"signal {name!r} refused: {exc}") from None
        except durable.AgentflowError as exc:
            raise CommandError(str(exc)) from None
        if delivery == "duplicate":
            self.stdout.write(
                f"duplicate: signal id {chosen} was sent to {run_id} before; nothing done again"
            )
            return
        self.stdout.write(f"delivered signal {name!r} to {run_id} (signal id {chosen})")
