"""Lease owners: tokens, their advisory-lock keys, and the renewer's bookkeeping (no database)."""

from __future__ import annotations

import os
import threading
from typing import Any

from django.conf import settings

from agentflow._core import leases


def test_owner_token__host_pid_and_a_nonce_so_equal_pids_in_other_namespaces_differ() -> None:
    token = leases._this_process().token
    host, pid, nonce = token.split("/")

    assert (host, int(pid)) == (settings.AGENTFLOW_HOSTNAME, os.getpid())
    assert len(nonce) == 8
    # Another process with the same pid on the same host (a PID namespace) gets another token.
    assert leases._Process().token != token


def test_lock_key__positive_62_bits_stable_and_distinct() -> None:
    keys = {leases.lock_key(f"host/{pid}/abcd") for pid in range(10_000)}

    assert len(keys) == 10_000
    assert all(0 < key < 2**62 for key in keys)
    assert leases.lock_key("host/1/abcd") == leases.lock_key("host/1/abcd")


def test_kept_alive__reports_a_lost_lease(settings: Any) -> None:
    settings.AGENTFLOW_LEASE_SECONDS = 1  # renew every 0.33 s
    lost = threading.Event()
    renewals: list[Any] = []

    def renew(conn: Any) -> bool:
        renewals.append(conn)
        return len(renewals) < 2  # the second renewal finds the step taken over

    with leases.kept_alive(renew, lost.set):
        assert lost.wait(timeout=10)
    assert len(renewals) == 2


def test_kept_alive__a_renewal_that_raises_is_logged_and_retried(settings: Any) -> None:
    settings.AGENTFLOW_LEASE_SECONDS = 1
    calls: list[int] = []
    third = threading.Event()

    def renew(conn: Any) -> bool:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("the database went away")
        third.set()
        return True

    with leases.kept_alive(renew, lambda: None):
        assert third.wait(timeout=10)


def test_kept_alive__a_short_step_costs_no_renewal(settings: Any) -> None:
    settings.AGENTFLOW_LEASE_SECONDS = 3
    renewals: list[bool] = []

    with leases.kept_alive(lambda conn: renewals.append(True) or True, lambda: None):
        pass

    assert renewals == []
