"""`manage.py bench [--json]`: agentflow against a plain Celery chain (docs/figures/bench.md)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor

from agentflow import logs
from agentflow.management.base import BaseCommand, number, whole
from config.bench.agent_scale import POSITIONS
from config.bench.runner import BenchOptions, run_bench
from config.bench.throughput import BenchError


class Command(BaseCommand):
    help = (
        "Measure agentflow against a plain Celery chain and DBOS on the configured Postgres and "
        "Redis: steps/s, commits per step, per-step overhead, the worker's memory, the sweeper's "
        "query and the retention purge at scale."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument("--runs", type=whole(1), default=1000, help="runs and chains")
        parser.add_argument(
            "--commit-runs", type=whole(1), default=100, help="runs per commit-counting phase"
        )
        parser.add_argument(
            "--history", type=whole(1), default=1_000_000, help="finished runs for the sweeper"
        )
        parser.add_argument("--stale", type=whole(1), default=1000, help="due runs to sweep")
        parser.add_argument("--skip-sweep", action="store_true", help="no sweeper figure")
        parser.add_argument(
            "--purge-runs",
            type=whole(0),
            default=50_000,
            help="aged finished runs to purge, alone and while agentflow runs (0: skip)",
        )
        parser.add_argument("--concurrency", type=whole(1), default=2, help="worker processes")
        parser.add_argument(
            "--rounds", type=whole(1), default=5, help="turns the chains and agentflow take"
        )
        parser.add_argument(
            "--child-kills", type=whole(0), default=5, help="pool-child kills (0: skip)"
        )
        parser.add_argument(
            "--worker-kills", type=whole(0), default=10, help="whole-worker kills (0: skip)"
        )
        parser.add_argument(
            "--agent-positions",
            type=_lengths,
            default=POSITIONS,
            help="lengths of the agent runs measured, comma-separated ('': skip)",
        )

        parser.add_argument(
            "--partner-rate",
            type=number(0),
            default=50.0,
            help="the limited step's partner limit in calls/s (0: skip those figures)",
        )
        parser.add_argument(
            "--partner-runs", type=whole(1), default=300, help="runs of the limited step"
        )
        parser.add_argument(
            "--partner-only", action="store_true", help="only the partner-limit figures"
        )
        parser.add_argument(
            "--start-runs",
            type=whole(0),
            default=10_000,
            help="runs started one by one and with start_many (0: skip that figure)",
        )
        parser.add_argument(
            "--starts-only", action="store_true", help="only the runs-started figures"
        )
        parser.add_argument(
            "--step-cost-runs",
            type=whole(0),
            default=200,
            help="runs of the step-cost figure, in this process (0: skip that figure)",
        )
        parser.add_argument(
            "--step-cost-only", action="store_true", help="only the step-cost figure"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        _require_migrated()
        bench = BenchOptions(
            runs=options["runs"],
            commit_runs=options["commit_runs"],
            history=options["history"],
            stale=options["stale"],
            skip_sweep=options["skip_sweep"],
            purge_runs=options["purge_runs"],
            concurrency=options["concurrency"],
            rounds=options["rounds"],
            child_kills=options["child_kills"],
            worker_kills=options["worker_kills"],
            agent_positions=options["agent_positions"],
            partner_rate=options["partner_rate"],
            partner_runs=options["partner_runs"],
            partner_only=options["partner_only"],
            start_runs=options["start_runs"],
            starts_only=options["starts_only"],
            step_cost_runs=options["step_cost_runs"],
            step_cost_only=options["step_cost_only"],
        )
        try:
            # This process starts every run it measures: a line each would bury the progress.
            with logs.quieted("agentflow.runs"):
                report = run_bench(bench, progress=lambda line: self.stderr.write(f"bench: {line}"))
        except BenchError as exc:
            raise CommandError(str(exc)) from None
        only = options["partner_only"] or options["starts_only"] or options["step_cost_only"]
        if options["json"] or only:
            self.stdout.write(json.dumps(report, indent=None if options["json"] else 2))
            return
        self.stdout.write(render(report))


def _lengths(text: str) -> tuple[int, ...]:
    return tuple(whole(1)(part) for part in text.split(",") if part.strip())


def _memory(memory: dict[str, Any]) -> str:
    return (
        f"{memory['pool_rss_mib']:.1f} ({memory['pool_growth_per_10k_steps_mib']:+.1f}) + "
        f"{memory['parent_rss_mib']:.1f} ({memory['parent_growth_per_10k_steps_mib']:+.1f})"
    )


def _dbos_rates(dbos: dict[str, Any]) -> str:
    return f"{dbos['steps_per_s']:,.1f} / {dbos['queue_steps_per_s']:,.1f}"


def render(report: dict[str, Any]) -> str:
    """The report as a readable table."""
    flow, plain, sweep, env = (
        report["agentflow"],
        report["celery_chain"],
        report["sweep"],
        report["environment"],
    )
    rows = [
        ("agentflow steps/s", f"{flow['steps_per_s']:,.1f}"),
        ("agentflow workflows/s", f"{flow['workflows_per_s']:,.2f}"),
        ("plain Celery chain steps/s", f"{plain['steps_per_s']:,.1f}"),
        ("ratio (agentflow / chain)", f"{report['ratio']:.3f}"),
        ("ratio per round", " ".join(f"{ratio:.2f}" for ratio in report["ratio_per_round"])),
        (
            "hand-written durable chain steps/s",
            f"{report['naive_durable_chain']['steps_per_s']:,.1f}",
        ),
        ("ratio (agentflow / hand-written)", f"{report['ratio_to_naive']:.3f}"),
        (
            "protocol floor steps/s (its writes alone on a chain; ÷ chain)",
            f"{report['protocol_floor_chain']['steps_per_s']:,.1f} "
            f"({report['ratio_floor_to_chain']:.3f})",
        ),
        ("ratio (agentflow / protocol floor)", f"{report['ratio_to_floor']:.3f}"),
        ("DBOS steps/s, 2 threads / its queue", _dbos_rates(report["dbos"])),
        (
            "ratio (agentflow / DBOS threads, queue)",
            f"{report['ratio_to_dbos']:.3f} / {report['ratio_to_dbos_queue']:.3f}",
        ),
        ("step overhead per process (ms)", f"{flow['step_overhead_ms']:.3f}"),
        (
            "CPU ms per step, own + Postgres: chain / agentflow / DBOS threads",
            " / ".join(
                f"{report['cpu_ms_per_step'][name]['own_ms']:.2f}+"
                f"{report['cpu_ms_per_step'][name]['postgres_ms']:.2f}"
                for name in ("chain", "flow", "dbos")
            ),
        ),
        (
            f"worker RSS after {flow['worker_memory']['steps']:,} steps, pool + parent (MiB; "
            "growth per 10,000 steps after the first turn)",
            _memory(flow["worker_memory"]),
        ),
        ("commits per read step", f"{flow['commits_per_read_step']:.3f}"),
        ("commits per effect step", f"{flow['commits_per_effect_step']:.3f}"),
    ]
    if sweep is not None:
        rows += [
            (
                f"sweeper query (ms) at {sweep['finished_runs']:,} finished, "
                f"{sweep['stale_runs']:,} due",
                f"{sweep['query_ms']:.3f}",
            ),
            ("sweeper uses run_sweep_due", "yes" if sweep["uses_partial_index"] else "NO"),
            (
                f"/metrics scrape (ms) at {sweep['finished_runs']:,} finished, "
                f"{sweep['scrape']['metric_files']} metric files",
                f"{sweep['scrape']['scrape_ms']:.3f}",
            ),
            (
                "/metrics queries use the partial indexes",
                "yes" if sweep["scrape"]["uses_partial_indexes"] else "NO",
            ),
        ]
    purge = report.get("purge")
    if purge is not None:
        rows += [
            (
                f"purge rows/s ({purge['alone']['runs']:,} runs x {purge['rows_per_run']} rows "
                f"beside {purge['finished_runs']:,} finished)",
                f"{purge['alone']['rows_per_s']:,.0f}",
            ),
            ("purge rows/s while agentflow runs", f"{purge['during_steps']['rows_per_s']:,.0f}"),
            (
                "agentflow steps/s alone / during a purge (ratio)",
                f"{purge['steps_per_s_alone']:,.0f} / {purge['steps_per_s_during_purge']:,.0f} "
                f"({purge['steps_ratio_during_purge']})",
            ),
        ]
    for agent in report.get("agent_scale") or ():
        rows.append(
            (
                f"agent run of {agent['positions']} positions: bytes/position, last task (ms), "
                "run (s), worker RSS (MB)",
                f"{agent['bytes_per_position']:,.0f} / {agent['ms_per_task_last']:.2f} / "
                f"{agent['run_s']:.1f} / {agent['worker_rss_mb']:.0f}",
            )
        )
    memory = report.get("agent_memory")
    if memory:
        rows.append(
            (
                "agent worker RSS (MB): started / after the longest run again",
                f"{memory['started_mb']:.0f} / {memory['after_longest_again_mb']:.0f}",
            )
        )
    started = report.get("starts")
    if started:
        rows.append(
            (
                f"runs started/s: one by one / start_many ({started['runs']:,} runs, "
                f"batches of {started['batch']:,}; ratio)",
                f"{started['one_by_one_runs_per_s']:,.0f} / {started['bulk_runs_per_s']:,.0f} "
                f"({started['ratio']})",
            )
        )
    cost = report.get("step_cost")
    if cost:
        rows.append(
            (
                "CPU per step in this process (us, median of rounds)",
                f"{cost['cpu_us_per_step_median']:,.0f}",
            )
        )
        rows.append(
            (
                "a read then an effect: engine modules entered / moves between them",
                f"{cost['path']['modules_entered']} / {cost['path']['moves']}",
            )
        )
    for kind, label in (("child_kill", "pool child"), ("worker_kill", "whole worker")):
        figure = report["recovery"].get(kind)
        if figure:
            rows.append(
                (
                    f"recovery after SIGKILL of a {label} (s), p50 / p99 / max of "
                    f"{figure['samples']}",
                    f"{figure['p50_s']:.2f} / {figure['p99_s']:.2f} / {figure['max_s']:.2f}",
                )
            )
    width = max(len(label) for label, _ in rows)
    lines = [f"{label:<{width}}  {value:>12}" for label, value in rows]
    lines.append("")
    lines.append(
        f"{flow['runs']} runs x {flow['steps'] // flow['runs']} steps; 1 worker, "
        f"{env['processes']} processes; {env['database']}; broker {env['broker']}; "
        f"Python {env['python']}, Celery {env['celery']}"
    )
    if flow["commit_phases"]["other_writers_xids_per_s"]:
        lines.append(
            f"note: other writers consumed {flow['commit_phases']['other_writers_xids_per_s']} "
            "transaction ids/s meanwhile; commits per step include them"
        )
    if sweep is not None:
        lines += ["", "sweeper plan:", sweep["plan"]]
    return "\n".join(lines)


def _require_migrated() -> None:
    """bench writes engine rows: on a database not migrated yet, say so instead of a traceback."""
    connection = connections[DEFAULT_DB_ALIAS]
    executor = MigrationExecutor(connection)
    unapplied = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if unapplied:
        name = connection.settings_dict["NAME"]
        raise CommandError(
            f"database {name!r} has {len(unapplied)} unapplied migrations: "
            "run `python manage.py migrate` on it first"
        )
