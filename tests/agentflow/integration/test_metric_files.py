"""Metric files of real processes: named so none collide, folded when their process is gone,
and never a count lower after a fold than before it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentflow._observe import metric_files

WRITER = textwrap.dedent(
    """
    import sys
    from agentflow._observe import metric_files
    metric_files.install()
    from prometheus_client import Counter, Histogram
    Counter("t_jobs", "jobs", ["kind"]).labels("a").inc(int(sys.argv[1]))
    Histogram("t_seconds", "time", buckets=(1, 10)).observe(float(sys.argv[2]))
    print(metric_files.process_identifier(), flush=True)
    if len(sys.argv) > 3:
        sys.stdin.read()  # stay alive until the test closes stdin
    """
)


@pytest.fixture
def metrics_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    return tmp_path


def write(metrics_dir: Path, jobs: int, seconds: float) -> str:
    done = subprocess.run(
        [sys.executable, "-c", WRITER, str(jobs), str(seconds)],
        env={"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir), "PATH": "/usr/bin:/bin"},
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def totals() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in metric_files.collect()
        for sample in family.samples
    }


def test_identifier__host_pid_namespace_pid_and_start_time_without_underscores() -> None:
    host, namespace, pid, start = metric_files.process_identifier().rsplit("-", 3)
    assert host and int(namespace) > 0 and int(pid) > 0 and int(start) > 0
    assert "_" not in metric_files.process_identifier()


def test_fold__dead_processes_files_become_one_archive_and_no_count_moves(
    metrics_dir: Path,
) -> None:
    first = write(metrics_dir, 5, 0.5)
    second = write(metrics_dir, 3, 20)
    before = totals()
    assert before[("t_jobs_total", (("kind", "a"),))] == 8
    assert before[("t_seconds_bucket", (("le", "1.0"),))] == 1
    assert before[("t_seconds_count", ())] == 2

    assert metric_files.fold_dead() == 2

    names = sorted(p.name for p in metrics_dir.glob("*.db"))
    assert names == ["counter_archive-1.db", "histogram_archive-1.db"]
    assert json.loads((metrics_dir / "archive.json").read_text()) == {
        "generation": 1,
        "folded": sorted([first, second]),
    }
    assert totals() == before

    third = write(metrics_dir, 4, 2)
    assert metric_files.fold_dead() == 1
    after = totals()
    assert after[("t_jobs_total", (("kind", "a"),))] == 12
    assert after[("t_seconds_count", ())] == 3
    assert sorted(p.name for p in metrics_dir.glob("*.db")) == [
        "counter_archive-2.db",
        "histogram_archive-2.db",
    ]
    assert json.loads((metrics_dir / "archive.json").read_text())["folded"] == [third]


def test_fold__leaves_live_processes_and_other_hosts_alone(metrics_dir: Path) -> None:
    live = subprocess.Popen(
        [sys.executable, "-c", WRITER, "2", "0.1", "stay"],
        env={"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir), "PATH": "/usr/bin:/bin"},
        cwd=Path(__file__).resolve().parents[3],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        ident = live.stdout.readline().strip() if live.stdout else ""
        # The same pid in another PID namespace under this very hostname: not ours to judge.
        here, _namespace, pid, start = ident.rsplit("-", 3)
        other = metrics_dir / f"counter_{here}-4026500000-{pid}-{start}.db"
        other.write_bytes((metrics_dir / f"counter_{ident}.db").read_bytes())

        assert metric_files.fold_dead() == 0
        assert (metrics_dir / f"counter_{ident}.db").exists() and other.exists()
        assert totals()[("t_jobs_total", (("kind", "a"),))] == 4  # live 2 + the copy's 2
    finally:
        live.communicate("")
    assert metric_files.fold_dead() == 1  # now it is gone
    assert totals()[("t_jobs_total", (("kind", "a"),))] == 4
    assert other.exists()


def test_fold__a_fold_that_stopped_before_deleting_counts_nothing_twice(metrics_dir: Path) -> None:
    ident = write(metrics_dir, 7, 0.5)
    kept = (metrics_dir / f"counter_{ident}.db").read_bytes()
    metric_files.fold_dead()
    # As if the fold had committed its manifest and died before deleting the folded file:
    (metrics_dir / f"counter_{ident}.db").write_bytes(kept)

    assert totals()[("t_jobs_total", (("kind", "a"),))] == 7
    metric_files.fold_dead()
    assert not (metrics_dir / f"counter_{ident}.db").exists()
    assert totals()[("t_jobs_total", (("kind", "a"),))] == 7


CREATING = textwrap.dedent(
    """
    import os, sys
    from agentflow._observe import metric_files
    # Where prometheus_client's MmapedDict stands between `open` and `truncate`.
    path = os.path.join(os.environ["PROMETHEUS_MULTIPROC_DIR"],
                        f"counter_{metric_files.process_identifier()}.db")
    open(path, "a+b").close()
    print(metric_files.process_identifier(), flush=True)
    sys.stdin.read()
    """
)


def test_fold__a_process_killed_before_its_file_was_sized_breaks_no_scrape(
    metrics_dir: Path,
) -> None:
    write(metrics_dir, 3, 0.5)
    creating = subprocess.Popen(
        [sys.executable, "-c", CREATING],
        env={"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir), "PATH": "/usr/bin:/bin"},
        cwd=Path(__file__).resolve().parents[3],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    ident = creating.stdout.readline().strip() if creating.stdout else ""
    empty = metrics_dir / f"counter_{ident}.db"
    assert empty.exists() and empty.stat().st_size == 0
    assert totals()[("t_jobs_total", (("kind", "a"),))] == 3  # scraped while it is being made

    creating.kill()  # SIGKILL: the file stays empty forever
    creating.wait()
    assert metric_files.fold_dead() == 2
    assert not empty.exists()
    assert totals()[("t_jobs_total", (("kind", "a"),))] == 3
