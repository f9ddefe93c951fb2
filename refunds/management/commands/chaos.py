"""`manage.py chaos`: N refunds under random SIGKILLs and a broker restart; one JSON report."""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError

from agentflow import logs
from agentflow._limits import rules
from agentflow.management.base import BaseCommand, number, whole
from agentflow.testing.processes import ProcessStartError
from refunds.chaos.exploration import DEFAULT_STEPS, explore
from refunds.chaos.processes import Sandbox
from refunds.chaos.run import ChaosConfig, ChaosError, run


class Command(BaseCommand):
    help = (
        "Send refunds through the real form while worker children, whole workers and the broker "
        "are SIGKILLed and partners misbehave; print one JSON report and exit non-zero if an "
        "invariant broke. Needs Postgres and redis-server; starts and stops its own "
        "broker, sandbox, beat and workers. With --postgres-restarts N it also starts a private "
        "PostgreSQL (the machine's PostgreSQL binaries, initdb in a temporary directory, a free "
        "port; as the postgres user when run as root) and runs everything on it: migrate, the "
        "form traffic of this process, workers and beat. It crashes that server N times "
        "mid-run (SIGKILL of the postmaster and every backend at once), keeps it down 2 s, and "
        "starts it again on the same port and data directory (crash recovery). With "
        "--postgres-outage SECONDS it stops that server (as an administrator does) once steps "
        "are in flight, keeps it down that long while a web process (gunicorn) is asked what "
        "operators and customers see, then starts it again; the report's database_outage "
        "section says what the pages answered, how soon the runs moved, and each process's "
        "ERROR lines and tracebacks. The configured database, which others may share, is never "
        "restarted; the private one is removed at the end (its log stays with the run's logs)."
    )

    def add_arguments(self, parser: Any) -> None:
        d = ChaosConfig()
        parser.add_argument("--refunds", type=whole(1), default=d.refunds, help="how many refunds")
        parser.add_argument("--json", action="store_true", help="print only the JSON report")
        parser.add_argument("--seed", type=int, default=None, help="reproduce a run's choices")
        parser.add_argument(
            "--timeout",
            type=number(0, inclusive=False),
            default=d.timeout_seconds,
            help="seconds to wait for every run to finish",
        )
        parser.add_argument("--workers", type=whole(1), default=d.workers)
        parser.add_argument(
            "--concurrency",
            type=whole(1),
            default=d.concurrency,
            help="prefork children per worker",
        )
        parser.add_argument(
            "--child-kills",
            type=whole(0),
            default=None,
            help="SIGKILLs of single pool children (default: refunds / 15)",
        )
        parser.add_argument(
            "--worker-kills",
            type=whole(0),
            default=d.worker_kills,
            help="SIGKILLs of a whole worker, each replaced by a fresh one",
        )
        parser.add_argument(
            "--no-broker-restart", action="store_true", help="do not kill -9 and restart the broker"
        )
        parser.add_argument(
            "--kill-interval",
            type=number(0, inclusive=False),
            default=d.kill_interval_seconds,
            help="mean seconds between kills",
        )
        parser.add_argument(
            "--rate",
            type=number(0, inclusive=False),
            default=d.submit_per_second,
            help="form submissions per second",
        )
        parser.add_argument(
            "--double-submits",
            type=whole(0),
            default=None,
            help="forms sent twice (default: refunds / 10)",
        )
        parser.add_argument(
            "--erase",
            type=whole(0),
            default=d.erase,
            help="customers erased (agentflow_erase) once their refund ended, before the "
            "invariants are checked (default 0)",
        )
        parser.add_argument("--lease-seconds", type=whole(1), default=d.lease_seconds)
        parser.add_argument("--sweep-interval", type=whole(1), default=d.sweep_interval_seconds)
        parser.add_argument(
            "--postgres-restarts",
            type=whole(0),
            default=d.postgres_restarts,
            help="crash-restarts of a private PostgreSQL the whole run uses (see above)",
        )
        parser.add_argument(
            "--postgres-outage",
            type=number(0),
            default=d.postgres_outage_seconds,
            metavar="SECONDS",
            help="stop a private PostgreSQL for this long, once, mid-run (see above)",
        )
        parser.add_argument(
            "--engine",
            choices=("graph", "agent"),
            default=d.engine,
            help="refunds as the graph workflow, or as agent runs asking the sandbox's model",
        )
        parser.add_argument(
            "--broker",
            choices=("redis", "rabbitmq"),
            default=d.broker,
            help="the run's private broker: redis-server, or a RabbitMQ node of its own",
        )
        parser.add_argument(
            "--pgbouncer",
            choices=("transaction", "session"),
            default=None,
            help="workers reach Postgres through a private PgBouncer in this pool mode "
            "(liveness direct)",
        )
        parser.add_argument(
            "--pgbouncer-pool",
            type=whole(1),
            default=d.pgbouncer_pool,
            help="PgBouncer's server connections (keep it below the worker processes)",
        )
        parser.add_argument("--no-faults", action="store_true", help="no partner faults")
        parser.add_argument(
            "--model",
            action="store_true",
            help="instead: the model-based test of the money paths (refunds.chaos.model), in "
            "this process against a sandbox of its own; with --examples, --steps and --seed",
        )
        parser.add_argument(
            "--examples", type=whole(1), default=200, help="--model: how many examples to explore"
        )
        parser.add_argument(
            "--steps",
            type=whole(1),
            default=DEFAULT_STEPS,
            help="--model: rules per example, at most",
        )
        parser.add_argument(
            "--partner-limits",
            type=_partner_limits,
            default=d.partner_limits,
            help='AGENTFLOW_PARTNER_LIMITS for the workers, e.g. \'{"stripe": {"rate": "5/s"}}\'',
        )
        parser.add_argument(
            "--stripe-rate",
            type=whole(0),
            default=d.stripe_rate,
            help="the sandbox's Stripe answers 429 past N requests a second (0: no limit)",
        )
        parser.add_argument(
            "--stripe-dark",
            type=number(0),
            default=d.stripe_dark_seconds,
            help="seconds Stripe answers 503 to everything, from --stripe-dark-after on",
        )
        parser.add_argument("--stripe-dark-after", type=number(0), default=d.stripe_dark_after)
        parser.add_argument(
            "--cleanup",
            action="store_true",
            help="delete the run's refunds and workflow runs afterwards",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["model"]:
            self._explore(options)
            return
        config = ChaosConfig(
            refunds=options["refunds"],
            seed=options["seed"],
            timeout_seconds=options["timeout"],
            workers=options["workers"],
            concurrency=options["concurrency"],
            child_kills=options["child_kills"],
            worker_kills=options["worker_kills"],
            broker_restart=not options["no_broker_restart"],
            kill_interval_seconds=options["kill_interval"],
            submit_per_second=options["rate"],
            double_submits=options["double_submits"],
            erase=options["erase"],
            lease_seconds=options["lease_seconds"],
            sweep_interval_seconds=options["sweep_interval"],
            faults=not options["no_faults"],
            cleanup=options["cleanup"],
            postgres_restarts=options["postgres_restarts"],
            postgres_outage_seconds=options["postgres_outage"],
            engine=options["engine"],
            broker=options["broker"],
            pgbouncer=options["pgbouncer"] or "",
            pgbouncer_pool=options["pgbouncer_pool"],
            partner_limits=options["partner_limits"],
            stripe_rate=options["stripe_rate"],
            stripe_dark_seconds=options["stripe_dark"],
            stripe_dark_after=options["stripe_dark_after"],
        )
        if config.postgres_outage_seconds and config.refunds < 2:
            raise CommandError("--postgres-outage needs 2 refunds or more")
        quiet = options["verbosity"] == 0

        def progress(line: str) -> None:
            if not quiet:
                self.stderr.write(line)

        previous = signal.signal(signal.SIGTERM, _interrupt)  # stop like Ctrl-C: clean up
        try:
            # Its customers start every run: a line each would bury the progress.
            with logs.quieted("agentflow.runs"):
                report = run(config, progress=progress)
        except (ChaosError, ProcessStartError) as exc:
            raise CommandError(str(exc)) from exc
        except KeyboardInterrupt:
            self.stderr.write("chaos: interrupted; every process it started is stopped")
            sys.exit(130)
        finally:
            signal.signal(signal.SIGTERM, previous)
        if not options["json"]:
            self.stdout.write(summary(report))
        self.stdout.write(json.dumps(report, indent=2))
        unmade = options["refunds"] - report["runs"]
        if unmade:  # invariants over fewer runs than asked prove less than they seem to
            self.stderr.write(f"chaos: {unmade} of {options['refunds']} customers got no refund")
            for error in report["submission_errors"]:
                self.stderr.write(f"  {error}")
        broken = [name for name, held in report["invariants"].items() if not held]
        if broken:
            self.stderr.write(f"chaos: invariants broken: {', '.join(broken)}")
            for name in broken:
                for line in report["violations"][name]["examples"]:
                    self.stderr.write(f"  {name}: {line}")
        if broken or unmade:
            sys.exit(1)

    def _explore(self, options: dict[str, Any]) -> None:
        """The model-based test at this budget; JSON figures, non-zero exit on a violation."""
        # A seed always, so that whatever this exploration finds can be replayed with it.
        seed = options["seed"] if options["seed"] is not None else random.randrange(2**32)
        stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        workdir = Path(settings.VAR_DIR) / "chaos" / f"model-{stamp}"
        workdir.mkdir(parents=True)
        sandbox = Sandbox(workdir)
        previous = signal.signal(signal.SIGTERM, _interrupt)  # stop like Ctrl-C: clean up
        try:
            sandbox.start({**os.environ, "AGENTFLOW_VAR_DIR": str(workdir)})
            # Every step runs in this process: its log lines would bury the report.
            with logs.quieted("agentflow", logging.CRITICAL):
                report = explore(
                    sandbox_url=sandbox.url,
                    examples=options["examples"],
                    steps=options["steps"],
                    seed_value=seed,
                    partner_settings={
                        "SANDBOX_URL": sandbox.url,
                        "STRIPE_API_BASE": sandbox.url,
                        "EMAIL_HOST": "127.0.0.1",
                        "EMAIL_PORT": sandbox.smtp_port,
                        "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
                    },
                )
        except ProcessStartError as exc:
            raise CommandError(str(exc)) from exc
        finally:
            signal.signal(signal.SIGTERM, previous)
            sandbox.kill()
        self.stdout.write(json.dumps(report, indent=2))
        if report["violations"]:
            self.stderr.write("chaos --model: an invariant broke; the steps above replay it")
            sys.exit(1)


def _partner_limits(text: str) -> str:
    """--partner-limits, refused before anything starts if the workers would refuse it."""
    try:
        rules.parse_limits(text)
    except rules.LimitsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    except RecursionError:
        raise argparse.ArgumentTypeError("the JSON is nested too deep") from None
    return text


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def summary(report: dict[str, Any]) -> str:
    """A few lines a person reads first; the JSON follows."""
    kills = report["kills"]
    rec = report["recovery_seconds"]
    held = ", ".join(
        f"{name} {'ok' if ok else 'BROKEN'}" for name, ok in report["invariants"].items()
    )
    return "\n".join(
        [
            f"{report['runs']} refunds in {report['elapsed_seconds']} s: "
            f"{report['completed']} completed, {report['failed']} failed, "
            f"{report['needs_attention']} need attention, {report['stuck']} stuck",
            f"kills: {kills['children']} children, {kills['workers']} whole workers, "
            f"{kills['broker_restarts']} broker restarts, "
            f"{kills['postgres_restarts']} database restarts",
            f"payments per refund: {report['payments_per_refund']['min']}"
            f"..{report['payments_per_refund']['max']}; duplicate e-mail deliveries: "
            f"{report['emails']['duplicate_deliveries']}",
            f"recovery: p50 {rec['p50']} s, p99 {rec['p99']} s, max {rec['max']} s "
            f"({rec['samples']} samples)",
            f"double submits: {report['double_submits']['same_refund']}"
            f"/{report['double_submits']['sent']} kept one refund",
            *_model_line(report),
            *_outage_line(report),
            *_erased_line(report),
            f"invariants: {held}",
            "",
        ]
    )


def _erased_line(report: dict[str, Any]) -> list[str]:
    found = report.get("erased")
    return [f"erased: {found['customers']} customers before the check"] if found else []


def _outage_line(report: dict[str, Any]) -> list[str]:
    found = report.get("database_outage")
    if not found:
        return []
    pages = found["while_down"]
    errors = ", ".join(f"{name} {n['errors']}" for name, n in found["log_lines"].items())
    return [
        f"database outage of {found['stopped_for_seconds']} s: admin "
        f"{pages.get('admin', {}).get('status')}, form {pages.get('form', {}).get('status')}; "
        f"runs moved {found['first_run_moved_after_seconds']} s after it answered; "
        f"ERROR lines: {errors}"
    ]


def _model_line(report: dict[str, Any]) -> list[str]:
    found = report.get("model")
    if not found:
        return []
    return [
        f"model: {found['requests_made']} requests for {found['turns_recorded']} turns recorded "
        f"({found['asked_again']} asked again after a lost answer)"
    ]
