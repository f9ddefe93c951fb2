"""The client address behind trusted proxies, and the per-address limit key."""

from __future__ import annotations

import pytest

from refunds.proxies import TrustedProxies, client_address, limit_key, parse_trusted_proxies

PROXY = "10.0.0.2"


def via(chain: str | None, trusted: str, peer: str = PROXY) -> str | None:
    meta = {"REMOTE_ADDR": peer}
    if chain is not None:
        meta["HTTP_X_FORWARDED_FOR"] = chain
    return client_address(meta, parse_trusted_proxies(trusted))


def test_parse__count_networks_and_nothing() -> None:
    assert parse_trusted_proxies("") == TrustedProxies()
    assert parse_trusted_proxies(" 2 ") == TrustedProxies(hops=2)
    parsed = parse_trusted_proxies("10.0.0.0/8, 2001:db8::/32,192.0.2.1")
    assert [str(n) for n in parsed.networks] == ["10.0.0.0/8", "2001:db8::/32", "192.0.2.1/32"]


@pytest.mark.parametrize("raw", ["one", "10.0.0.0/33", "-1", "10.0.0.0/8; 10.1.0.0/16"])
def test_parse__bad_value_names_the_bad_part(raw: str) -> None:
    with pytest.raises(ValueError, match="neither a number of hops nor"):
        parse_trusted_proxies(raw)


def test_no_trusted_proxies__the_peer_is_the_client_whatever_the_header_says() -> None:
    assert via("198.51.100.7", "") == PROXY


def test_one_hop__the_last_forwarded_hop_is_the_client() -> None:
    assert via("198.51.100.7", "1") == "198.51.100.7"


def test_one_hop__spoofed_hops_on_the_left_are_never_read() -> None:
    assert via("1.2.3.4, 5.6.7.8, 198.51.100.7", "1") == "198.51.100.7"


def test_two_hops__the_second_hop_from_the_right() -> None:
    assert via("1.2.3.4, 198.51.100.7, 10.0.0.9", "2") == "198.51.100.7"


def test_hops__fewer_hops_than_proxies_is_the_peer() -> None:
    assert via(None, "1") == PROXY
    assert via("198.51.100.7", "2") == PROXY


def test_hops__a_garbled_hop_counts_as_the_peer() -> None:
    assert via("1.2.3.4, unknown", "1") == PROXY


def test_networks__first_hop_from_the_right_outside_them() -> None:
    chain = "1.2.3.4, 198.51.100.7, 10.1.2.3"
    assert via(chain, "10.0.0.0/8") == "198.51.100.7"
    assert via(chain, "10.0.0.0/8, 198.51.100.0/24") == "1.2.3.4"


def test_networks__a_peer_outside_them_is_the_client_itself() -> None:
    assert via("1.2.3.4", "10.0.0.0/8", peer="203.0.113.5") == "203.0.113.5"


def test_networks__every_hop_trusted_is_the_leftmost() -> None:
    assert via("10.9.9.9", "10.0.0.0/8") == "10.9.9.9"


def test_hops_with_ports_and_brackets_are_read() -> None:
    assert via("198.51.100.7:51234", "1") == "198.51.100.7"
    assert via("[2001:db8::7]:443", "1") == "2001:db8::7"


def test_peer_that_is_no_address_is_none() -> None:
    assert client_address({"REMOTE_ADDR": "unix:/run/gunicorn.sock"}, TrustedProxies()) is None
    assert client_address({}, TrustedProxies()) is None


def test_limit_key__ipv4_as_is_ipv6_per_64_mapped_v4_as_v4() -> None:
    assert limit_key("203.0.113.9") == "203.0.113.9"
    assert limit_key("2001:db8:1:2:aaaa:bbbb:cccc:dddd") == "2001:db8:1:2::"
    assert limit_key("2001:db8:1:2::1") == limit_key("2001:db8:1:2:ffff::9")
    assert limit_key("2001:db8:1:3::1") != limit_key("2001:db8:1:2::1")
    assert limit_key("::ffff:203.0.113.9") == "203.0.113.9"
    assert limit_key("") is None
    assert limit_key(None) is None
