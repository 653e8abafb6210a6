"""Which exporters a puller may dial: the ``allowed_peers`` policy.

A descriptor arrives inside a request, so its ``ip``:``port`` is chosen by whoever sent the
request. Without a policy an engine could be steered into connecting anywhere its network
reaches (other services on the host, the cloud metadata address ``169.254.169.254``...). The
policy is checked before any socket is opened; the ip is always a literal address (descriptors
are never resolved through DNS).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from smg_grpc_proto.errors import RemotePeerRefusedError

__all__ = [
    "ALLOW_ANY",
    "DEFAULT_ALLOWED_PEERS",
    "PeerPolicy",
    "PeerSpec",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
PeerSpec = str | IPAddress | IPNetwork
"""One allow-list entry: a network (``"10.0.0.0/8"``), an address (``"10.1.2.3"``), an address
and port (``"10.1.2.3:5000"``, ``"[fd00::1]:5000"``), or the same as ``ipaddress`` objects."""

ALLOW_ANY = "any"
"""``allowed_peers=ALLOW_ANY`` dials every unicast address (what ``smg-grpc-servicer``'s puller
does): only for engines whose requests come from a trusted gateway."""

DEFAULT_ALLOWED_PEERS: tuple[str, ...] = (
    "127.0.0.0/8",
    "::1/128",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "fc00::/7",
)
"""Loopback and the private ranges (RFC 1918, IPv6 unique-local): where a gateway and its
engines live. Link-local (``169.254.0.0/16``, where cloud metadata services answer), public and
carrier-grade NAT ranges must be listed explicitly."""


def _plain(address: IPAddress) -> IPAddress:
    """``address`` without its IPv6 zone, an IPv4-mapped IPv6 address as IPv4."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.scope_id is not None:
            return ipaddress.IPv6Address(str(address).split("%", 1)[0])
    return address


def _parse(spec: PeerSpec) -> tuple[IPNetwork, int | None]:
    if isinstance(spec, (ipaddress.IPv4Network, ipaddress.IPv6Network)):
        return spec, None
    if isinstance(spec, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        return ipaddress.ip_network(_plain(spec)), None
    if not isinstance(spec, str):
        raise TypeError(f"allowed_peers entry must be a str or ipaddress object, got {spec!r}")
    text = spec.strip()
    port: int | None = None
    host = text
    if text.startswith("["):  # [v6]:port
        close = text.find("]")
        if close < 0 or not text[close + 1 :].startswith(":"):
            raise ValueError(f"allowed_peers entry {spec!r}: expected [ipv6]:port")
        host, port_text = text[1:close], text[close + 2 :]
        port = _port(spec, port_text)
    elif text.count(":") == 1:  # v4:port
        host, port_text = text.split(":")
        port = _port(spec, port_text)
    try:
        network = ipaddress.ip_network(host, strict=True)
    except ValueError as exc:
        raise ValueError(f"allowed_peers entry {spec!r} is not an IP network: {exc}") from None
    if port is not None and network.num_addresses != 1:
        raise ValueError(f"allowed_peers entry {spec!r}: a port goes with one address")
    return network, port


def _port(spec: str, text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 0xFFFF:
        raise ValueError(f"allowed_peers entry {spec!r}: port must be 1..65535")
    return int(text)


@dataclass(frozen=True)
class PeerPolicy:
    """A parsed ``allowed_peers``: :meth:`check` raises unless ``ip``:``port`` is allowed."""

    rules: tuple[tuple[IPNetwork, int | None], ...]
    any: bool = False

    @classmethod
    def of(cls, allowed: str | Iterable[PeerSpec] | None) -> PeerPolicy:
        """``None`` is :data:`DEFAULT_ALLOWED_PEERS`; ``"any"`` allows every unicast address."""
        if allowed is None:
            allowed = DEFAULT_ALLOWED_PEERS
        if isinstance(allowed, str):
            if allowed.strip().lower() == ALLOW_ANY:
                return cls((), any=True)
            allowed = (allowed,)
        return cls(tuple(_parse(spec) for spec in allowed))

    def check(self, ip: str, port: int) -> None:
        try:
            address = _plain(ipaddress.ip_address(ip))
        except ValueError:
            raise RemotePeerRefusedError(
                f"remote descriptor ip {ip!r} is not an IP address (hostnames are never resolved)",
                field="ip",
                expected="an IP address",
                actual=ip,
            ) from None
        if address.is_unspecified or address.is_multicast or address == _BROADCAST:
            raise RemotePeerRefusedError(
                f"remote descriptor ip {ip} is not a unicast address: refused",
                field="ip",
                expected="a unicast address",
                actual=ip,
            )
        if self.any:
            return
        ip_allowed = False
        for network, allowed_port in self.rules:
            if address.version == network.version and address in network:
                ip_allowed = True
                if allowed_port is None or allowed_port == port:
                    return
        if ip_allowed:
            raise RemotePeerRefusedError(
                f"remote descriptor port {port} of {ip} is not in the puller's allowed_peers",
                field="port",
                expected=[f"{n}:{p}" for n, p in self.rules if p is not None and address in n],
                actual=port,
            )
        raise RemotePeerRefusedError(
            f"remote descriptor ip {ip} is not in the puller's allowed_peers "
            f"({', '.join(str(n) + (f':{p}' if p else '') for n, p in self.rules) or 'none'}); "
            'pass allowed_peers=[...] (or "any" for a trusted gateway) to dial it',
            field="ip",
            expected=[str(n) for n, _ in self.rules],
            actual=ip,
        )


_BROADCAST = ipaddress.IPv4Address("255.255.255.255")
