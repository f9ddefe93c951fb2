"""`manage.py sandbox`: run the partner sandbox (docs/refunds.md), with defaults from Django
settings."""

from __future__ import annotations

import sqlite3
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management.base import CommandError

from agentflow.management.base import BaseCommand, number, whole
from refunds.sandbox import cancel
from refunds.sandbox.server import serve


class Command(BaseCommand):
    help = "Run the partner sandbox (Stripe subset, airline, CRM, SMTP sink) until Ctrl-C."
    requires_system_checks: list[str] = []  # no database needed: start even before migrate
    requires_migrations_checks = False

    def add_arguments(self, parser: Any) -> None:
        default_port = urlsplit(settings.SANDBOX_URL).port or 8765
        parser.add_argument(
            "action",
            nargs="?",
            default="serve",
            choices=("serve", "cancel-flight"),
            help="serve (the default), or cancel-flight FLIGHT --date YYYY-MM-DD: the running "
            "sandbox airline cancels it and sends the refund service its signed notice",
        )
        parser.add_argument("flight", nargs="?", help="cancel-flight: the flight, e.g. SK1236")
        parser.add_argument("--date", help="cancel-flight: the day it was to fly (YYYY-MM-DD)")
        parser.add_argument(
            "--passengers",
            type=whole(1, 1000),
            default=300,
            help="cancel-flight: how many passengers it had (default 300)",
        )
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument(
            "--port", type=whole(1, 65535), default=None, help=f"HTTP port (default {default_port})"
        )
        parser.add_argument(
            "--smtp-port",
            type=whole(1, 65535),
            default=None,
            help="SMTP port (default: SANDBOX_SMTP_PORT when set, else --port + 1)",
        )
        parser.add_argument(
            "--state",
            default=str(settings.VAR_DIR / "sandbox.sqlite3"),
            help="the SQLite state file",
        )
        parser.add_argument(
            "--key-window-seconds",
            type=number(0, inclusive=False),
            default=86400.0,
            help="how long idempotency keys are kept (Stripe: at least 24 h)",
        )
        parser.add_argument(
            "--authorization-seconds",
            type=number(0, inclusive=False),
            default=7 * 86400.0,
            help="how long an uncaptured card hold lasts before it lapses (Stripe: 7 days)",
        )
        parser.add_argument(
            "--today-offset-days",
            type=whole(-36500, 36500),
            default=settings.SANDBOX_TODAY_OFFSET_DAYS,
            help="how many days after the real date the airline's today is, its bookings and "
            "schedule with it (default SANDBOX_TODAY_OFFSET_DAYS, else 0)",
        )

        for partner in ("stripe", "airline"):
            parser.add_argument(
                f"--{partner}-rate",
                type=whole(0),
                default=0,
                metavar="N",
                help=f"play a limited {partner}: 429 beyond N requests a second (0: no limit)",
            )
            parser.add_argument(
                f"--{partner}-concurrency",
                type=whole(0),
                default=0,
                metavar="N",
                help=f"play a limited {partner}: 429 beyond N requests in flight (0: no limit)",
            )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "cancel-flight":
            self._cancel_flight(options["flight"], options["date"], options["passengers"])
            return
        port = options["port"]
        smtp_port = options["smtp_port"]
        if smtp_port is None:
            # An explicitly set SANDBOX_SMTP_PORT wins over the derived --port + 1: workers
            # send mail to that variable's port, so the sink must listen there.
            use_setting = port is None or settings.SANDBOX_SMTP_PORT_IS_SET
            smtp_port = settings.SANDBOX_SMTP_PORT if use_setting else port + 1
        if port is None:
            port = urlsplit(settings.SANDBOX_URL).port or 8765

        def ready(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        try:
            serve(
                host=options["host"],
                port=port,
                smtp_port=smtp_port,
                state_path=options["state"],
                key_window_seconds=options["key_window_seconds"],
                authorization_seconds=options["authorization_seconds"],
                today_offset_days=options["today_offset_days"],
                on_ready=ready,
                limits={
                    partner: {
                        "rate": options[f"{partner}_rate"],
                        "concurrency": options[f"{partner}_concurrency"],
                    }
                    for partner in ("stripe", "airline")
                },
            )
        except (OSError, OverflowError, sqlite3.Error) as exc:
            # A port taken (or past 65535: --port 65535 puts SMTP on the next), a host or a
            # state file that cannot be used.
            raise CommandError(f"the sandbox cannot start: {exc}") from None

    def _cancel_flight(self, flight: str | None, day: str | None, passengers: int) -> None:
        """Ask the running sandbox (SANDBOX_URL) to cancel the flight and announce it to
        REFUNDS_AIRLINE_NOTICES_URL, signed with REFUNDS_AIRLINE_SECRET."""
        if not flight or not day:
            raise CommandError(
                "cancel-flight needs a flight and --date, e.g. SK1236 --date 2027-03-16"
            )
        try:
            self.stdout.write(cancel.cancel_flight(flight, day, passengers))
        except cancel.Refused as refused:
            raise CommandError(str(refused)) from None
