"""Lease owners: the `host/pid/start` format and when an owner is provably dead."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings

from agentflow import leases


def start_ticks(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return stat.read().rsplit(b")", 1)[1].split()[19].decode()


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A short-lived process that lives until its stdin is closed."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)  # fmt: skip
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def finish(proc: subprocess.Popen[bytes], *, reap: bool) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    if reap:
        proc.wait(timeout=10)
    else:  # wait for the zombie without reaping it
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)


def test_current_owner__host_pid_and_start_time() -> None:
    host, pid, start = leases.current_owner().split("/")

    assert host == settings.AGENTFLOW_HOSTNAME
    assert int(pid) == os.getpid()
    assert start == start_ticks(os.getpid())


def test_owner_is_dead__own_process_is_alive() -> None:
    assert not leases.owner_is_dead(leases.current_owner())


def test_owner_is_dead__running_process_is_alive(child: subprocess.Popen[bytes]) -> None:
    owner = f"{settings.AGENTFLOW_HOSTNAME}/{child.pid}/{start_ticks(child.pid)}"
    assert not leases.owner_is_dead(owner)


def test_owner_is_dead__exited_and_reaped_process_is_dead(child: subprocess.Popen[bytes]) -> None:
    owner = f"{settings.AGENTFLOW_HOSTNAME}/{child.pid}/{start_ticks(child.pid)}"
    finish(child, reap=True)
    assert leases.owner_is_dead(owner)


def test_owner_is_dead__zombie_is_dead(child: subprocess.Popen[bytes]) -> None:
    owner = f"{settings.AGENTFLOW_HOSTNAME}/{child.pid}/{start_ticks(child.pid)}"
    finish(child, reap=False)
    assert leases.owner_is_dead(owner)


def test_owner_is_dead__recycled_pid_is_dead(child: subprocess.Popen[bytes]) -> None:
    """Same pid, another start time: the owner that held the lease is gone."""
    ticks = int(start_ticks(child.pid))
    assert leases.owner_is_dead(f"{settings.AGENTFLOW_HOSTNAME}/{child.pid}/{ticks - 1}")


@pytest.mark.parametrize(
    "owner",
    ["", "garbage", "a/b/c", "host/1", "too/many/parts/here"],
)
def test_owner_is_dead__unparseable_owner_is_never_judged_dead(owner: str) -> None:
    assert not leases.owner_is_dead(owner)


def test_owner_is_dead__other_hosts_are_never_judged_dead(child: subprocess.Popen[bytes]) -> None:
    finish(child, reap=True)
    assert not leases.owner_is_dead(f"another-host/{child.pid}/1")


def test_kept_alive__reports_a_lost_lease(settings: Any) -> None:
    settings.AGENTFLOW_LEASE_SECONDS = 1  # renew every 0.33 s
    lost = threading.Event()
    renewals: list[bool] = []

    def renew() -> bool:
        renewals.append(True)
        return len(renewals) < 2  # the second renewal finds the step taken over

    with leases.kept_alive(renew, lost.set):
        assert lost.wait(timeout=10)
    assert len(renewals) == 2


def test_kept_alive__a_short_step_costs_no_renewal(settings: Any) -> None:
    settings.AGENTFLOW_LEASE_SECONDS = 3
    renewals: list[bool] = []

    with leases.kept_alive(lambda: renewals.append(True) or True, lambda: None):
        pass

    assert renewals == []
