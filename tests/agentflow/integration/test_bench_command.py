"""`manage.py bench --json` end to end at toy sizes: the report's shape, never its speed."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from agentflow._base.states import RunStatus
from agentflow._observe import metrics
from agentflow.models import WorkflowRun
from config.bench import cpu, dbos_peer, runner, workload


@pytest.mark.django_db(transaction=True)
def test_bench__reports_every_figure_and_cleans_up(broker: object) -> None:
    # The scrape is timed before bench's workers run: the metric files it reads are the ones
    # already there, so this process writes one (alone, the directory starts empty).
    metrics.SWEEPS.inc(0)
    out = io.StringIO()
    call_command(
        "bench",
        "--json",
        *("--runs", "4", "--commit-runs", "2", "--history", "300", "--stale", "5"),
        *("--child-kills", "1", "--worker-kills", "0", "--purge-runs", "30"),
        *("--agent-positions", "4,8", "--start-runs", "30", "--step-cost-runs", "2"),
        stdout=out,
        stderr=io.StringIO(),
    )
    report = json.loads(out.getvalue())

    flow, chain, sweep = report["agentflow"], report["celery_chain"], report["sweep"]
    for figure in ("steps_per_s", "workflows_per_s", "step_overhead_ms"):
        assert isinstance(flow[figure], int | float), figure
    assert flow["steps_per_s"] > 0 and flow["workflows_per_s"] > 0
    assert chain["steps_per_s"] > 0 and report["ratio"] > 0
    assert chain["runs"] == flow["runs"] == 4  # in turns: 4 rounds of one run each
    assert len(report["ratio_per_round"]) == 4 and all(r > 0 for r in report["ratio_per_round"])
    assert report["naive_durable_chain"]["runs"] == 4 and report["ratio_to_naive"] > 0
    # The protocol's writes alone, on a plain chain: what bounds any engine with its guarantees.
    assert report["protocol_floor_chain"]["runs"] == 4 and report["ratio_to_floor"] > 0
    assert report["ratio_floor_to_chain"] > 0 and len(report["ratio_floor_to_chain_per_round"]) == 4
    # DBOS in the same turns, a process and a system database per mode, dropped after.
    dbos = report["dbos"]
    assert dbos["version"].startswith("3.") and (dbos["threads"], dbos["queue_concurrency"]) == (
        2,
        2,
    )
    assert dbos["steps_per_s"] > 0 and dbos["queue_steps_per_s"] > 0
    assert report["ratio_to_dbos"] > 0 and report["ratio_to_dbos_queue"] > 0
    assert len(report["ratio_to_dbos_per_round"]) == 4
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_database WHERE datname LIKE %s",
            [f"{connection.settings_dict['NAME']}_dbos%"],
        )
        assert cursor.fetchone()[0] == 0
    memory = flow["worker_memory"]
    assert memory["steps"] == 4 * workload.STEPS and len(memory["samples"]) == 5
    assert memory["rss_mib"] > 0 and memory["pool_rss_mib"] > 0 and memory["parent_rss_mib"] > 0
    # Growth counts from the end of the first turn (one run here), the warm-up's last part.
    assert memory["warmup_steps"] == workload.STEPS
    for figure in ("pool_growth_per_10k_steps_mib", "parent_growth_per_10k_steps_mib"):
        assert isinstance(memory[figure], float), figure
    cpu_ms = report["cpu_ms_per_step"]
    assert set(cpu_ms) == {"chain", "flow", "naive", "floor", "dbos", "dbos_queue"}
    assert cpu_ms["flow"]["own_ms"] > 0 and cpu_ms["dbos"]["own_ms"] > 0
    # Counted from Postgres transaction ids, which other writers on the cluster also consume.
    assert flow["commits_per_read_step"] >= 1.0
    assert flow["commits_per_effect_step"] >= 2.0
    assert sweep["finished_runs"] >= 300 and sweep["stale_runs"] == 5 and sweep["due_found"] == 5
    assert sweep["query_ms"] > 0
    assert "run_sweep_due" in sweep["plan"]
    started = report["starts"]
    assert started["runs"] == 30 and started["ratio"] > 0
    assert started["one_by_one_runs_per_s"] > 0 and started["bulk_runs_per_s"] > 0
    cost = report["step_cost"]
    assert cost["runs"] == 2 and len(cost["cpu_us_per_step"]) == 3
    assert cost["cpu_us_per_step_median"] > 0
    assert cost["personal_field_us"]["seal"] > 0 and cost["personal_field_us"]["open"] > 0
    # The path's map: the run's steps enter the engine's step path, never agent mode's.
    path = cost["path"]["modules"]
    assert {"agentflow._engine.runtime", "agentflow._store.steps"} <= set(path)
    assert not [m for m in path if m.startswith(("agentflow.agent", "agentflow.testing"))]
    assert cost["path"]["modules_entered"] == len(path) and cost["path"]["moves"] > 0
    assert sweep["scrape"]["scrape_ms"] > 0 and len(sweep["scrape"]["scrape_ms_samples"]) == 7
    assert sweep["scrape"]["metric_files"] >= 1
    assert report["environment"]["processes"] == 2
    assert isinstance(report["environment"]["debug"], bool)
    purge = report["purge"]
    assert purge["finished_runs"] >= 300
    # Each aged run: itself, 10 checkpoints, 1 event. Alone: all 30 at once; beside the steps:
    # a third of them in each of the 3 turns.
    assert (purge["alone"]["runs"], purge["alone"]["rows"]) == (30, 30 * 12)
    assert (purge["during_steps"]["runs"], purge["during_steps"]["rows"]) == (30, 30 * 12)
    assert purge["alone"]["transactions"] == 1 and purge["during_steps"]["transactions"] == 3
    assert purge["alone"]["rows_per_s"] > 0 and purge["during_steps"]["rows_per_s"] > 0
    # A toy purge lasts milliseconds, maybe shorter than any step: only the shape is asserted.
    assert purge["steps_per_s_alone"] >= 0 and purge["steps_per_s_during_purge"] >= 0
    assert len(purge["steps_ratio_per_turn"]) == 3 and purge["window_seconds"] > 0
    short, longer = report["agent_scale"]
    assert (short["positions"], longer["positions"]) == (4, 8)
    assert longer["bytes"] > short["bytes"] > 0 and short["bytes_per_position"] > 0
    assert short["ms_per_task_last"] > 0 and short["run_s"] > 0 and short["worker_rss_mb"] > 0
    memory = report["agent_memory"]
    assert memory["started_mb"] > 0 and len(memory["after_runs_mb"]) == 2
    assert memory["after_longest_again_mb"] > 0
    child = report["recovery"]["child_kill"]
    # Measured against the bound in the report, not asserted: a busy machine is slower.
    assert child["samples"] == 1 and child["p50_s"] > 0 and report["recovery"]["bound_s"] > 0

    left = WorkflowRun.objects.exclude(workflow=workload.HISTORY)
    assert list(left.values_list("workflow", "status")) == []
    assert (
        WorkflowRun.objects.filter(
            workflow=workload.HISTORY, status=RunStatus.COMPLETED, wake_at__isnull=True
        ).count()
        == 300
    )


@pytest.mark.parametrize("args", [["--runs", "-1"], ["--runs", "0"], ["--child-kills", "x"]])
def test_bench__a_count_that_is_not_one_says_so_before_anything_runs(args: list[str]) -> None:
    with pytest.raises(CommandError, match=f"{args[1]!r} is not a whole number of"):
        call_command("bench", *args)


def test_bench__on_a_database_not_migrated__says_to_migrate_and_runs_nothing() -> None:
    """A fresh database is what the figures' bench starts from: a traceback was all it said."""
    name = f"{connection.settings_dict['NAME']}_unmigrated"
    admin = connection.settings_dict | {"NAME": "postgres"}
    url = "postgres://{USER}@{HOST}:{PORT}/".format(**admin)
    with psycopg.connect(url + "postgres", autocommit=True) as server:
        server.execute(f'DROP DATABASE IF EXISTS "{name}"')
        server.execute(f'CREATE DATABASE "{name}"')
    try:
        env = {**os.environ, "DATABASE_URL": url + name, "DJANGO_DEBUG": "1"}
        done = subprocess.run(
            [sys.executable, "manage.py", "bench", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        with psycopg.connect(url + "postgres", autocommit=True) as server:
            server.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    assert done.returncode != 0
    assert f"database {name!r} has" in done.stderr
    assert "unapplied migrations: run `python manage.py migrate` on it first" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


@pytest.mark.django_db(transaction=True)
def test_bench__a_dbos_peer_takes_no_cpu_outside_its_turns() -> None:
    """DBOS polls its queues from a thread of its own (a third of a core for the 10 ms queue,
    idle): left running, it would slow whichever contender has the turn."""
    peer = dbos_peer.DbosPeer(runner._conninfo(), steps=2, mode="queue").start()
    try:
        [pid] = peer.pids()
        assert dbos_peer._state(pid) == "T"  # stopped once launched
        before = cpu.seconds(pid)
        assert peer.run(3, timeout=60) > 0
        assert dbos_peer._state(pid) == "T"  # and again after its turn
        assert cpu.seconds(pid) > before  # it did run meanwhile
    finally:
        peer.stop()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_database WHERE datname = %s", [peer.dbname])
        assert cursor.fetchone()[0] == 0
