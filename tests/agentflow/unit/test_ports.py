"""Ports for servers a test or command starts later: never where outgoing connections land."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from agentflow.testing.processes import free_port


def _ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_free_port__below_the_ephemeral_range_and_bindable() -> None:
    for _ in range(20):
        port = free_port()
        assert port < _ephemeral_low()
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_free_port__pair__both_ports_free_and_below_the_ephemeral_range() -> None:
    port = free_port(pair=True)
    assert port + 1 < _ephemeral_low()
    with socket.socket() as first, socket.socket() as second:
        first.bind(("127.0.0.1", port))
        second.bind(("127.0.0.1", port + 1))


def test_free_port__a_shards_range_is_kept_and_no_port_is_handed_out_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENTFLOW_TEST_PORTS", "20000-20009")
    ports = [free_port(pair=True) for _ in range(3)]
    assert all(port >= 20_000 and port + 1 <= 20_009 for port in ports)
    handed = {each for port in ports for each in (port, port + 1)}
    assert len(handed) == 6  # three pairs, none sharing a port
