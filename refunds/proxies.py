"""The client's address behind reverse proxies, and the key that per-address limits count it by.

Without AGENTFLOW_TRUSTED_PROXIES the peer (REMOTE_ADDR) is the client, which is right when
nothing sits in front. Behind a proxy every customer shares the proxy's address, so a
per-address limit becomes a site-wide switch. Naming the proxies (a count of hops, or their
networks) makes the client the first X-Forwarded-For hop, read from the right, that is not one
of them. Hops further left were written by whoever sent the request and prove nothing, so they
are never read: a client cannot spoof its way past a limit by adding hops.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from django.conf import settings

if TYPE_CHECKING:
    from django.http import HttpRequest

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: IPv6 clients get a /64 each (one home or one cloud host), so that rotating through the
#: addresses of one network does not reset a limit.
IPV6_LIMIT_PREFIX = 64


@dataclass(frozen=True, kw_only=True)
class TrustedProxies:
    """Either how many proxies stand in front (`hops`), or which networks they live in."""

    hops: int = 0
    networks: tuple[IPNetwork, ...] = ()


@lru_cache(maxsize=8)
def parse_trusted_proxies(raw: str) -> TrustedProxies:
    """'' (none), a count of hops ('1'), or comma-separated CIDRs or addresses.

    Raises:
        ValueError: with a message naming the bad part.
    """
    text = (raw or "").strip()
    if not text:
        return TrustedProxies()
    if text.isdigit():
        return TrustedProxies(hops=int(text))
    networks = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ValueError(
                f"{part!r} is neither a number of hops nor an address or network (CIDR)"
            ) from None
    return TrustedProxies(networks=tuple(networks))


def client_address(meta: dict[str, Any], trusted: TrustedProxies) -> str | None:
    """The client's IP address as `trusted` proxies report it; None if REMOTE_ADDR is no IP."""
    peer = _ip(meta.get("REMOTE_ADDR"))
    if peer is None:
        return None
    if not trusted.hops and not trusted.networks:
        return str(peer)
    forwarded = [hop.strip() for hop in str(meta.get("HTTP_X_FORWARDED_FOR", "")).split(",")]
    chain = [hop for hop in forwarded if hop] + [str(peer)]
    if trusted.hops:
        if len(chain) <= trusted.hops:
            return str(peer)  # fewer hops than proxies: it did not come through all of them
        # A trusted proxy wrote this hop; if it is not an address, count the peer instead.
        return str(_ip(chain[-1 - trusted.hops]) or peer)
    nearest_trusted = peer
    for hop in reversed(chain):
        address = _ip(hop)
        if address is None:
            return str(nearest_trusted)
        if not any(address in network for network in trusted.networks):
            return str(address)
        nearest_trusted = address
    return str(nearest_trusted)  # every hop is a proxy of ours (a health check, say)


def limit_key(address: str | None) -> str | None:
    """What a per-address limit counts: the IPv4 address, or the IPv6 /64 network's address."""
    ip = _ip(address)
    if ip is None:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        network = ipaddress.ip_network(f"{ip}/{IPV6_LIMIT_PREFIX}", strict=False)
        return str(network.network_address)
    return str(ip)


def client_key(request: HttpRequest) -> str | None:
    """The request's limit key under AGENTFLOW_TRUSTED_PROXIES (also axes' client address)."""
    trusted = parse_trusted_proxies(settings.AGENTFLOW_TRUSTED_PROXIES)
    return limit_key(client_address(request.META, trusted))


def _ip(value: object) -> IPAddress | None:
    """An address from a header hop: tolerates a port ('1.2.3.4:80', '[2001:db8::1]:443')."""
    text = str(value or "").strip()
    if text.startswith("["):
        text = text[1 : text.find("]")] if "]" in text else text
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip
