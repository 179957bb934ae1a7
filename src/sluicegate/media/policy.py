"""Where the gateway may fetch media from: the address policy.

A client's image URL must never make the gateway (or an engine behind it) reach what only
the gateway can reach: the cloud's metadata service, its own loopback, the private network.
So every address the fetcher connects to is checked here, after the name was resolved (the
address connected to is the one checked: a name that resolves to a public address once and
to a private one the next time gains nothing), and again for every redirect.

Refused unless allowed: metadata addresses, loopback, link-local, private (RFC 1918, unique
local IPv6, carrier-grade NAT), the unspecified address (0.0.0.0 reaches the host itself on
Linux), multicast and every other range that is not globally routable. An IPv6 form that
carries an IPv4 address (6to4, NAT64, Teredo) is refused when either address is; an
IPv4-mapped one is its IPv4 address.

The allow-list (the operator's) holds host names, addresses and CIDR
ranges: an address allows only itself (allowing 127.0.0.2 does not allow 127.0.0.1), a range
its members, and a host name whatever that name resolves to (an operator's own image server
on a private network), never another name that resolves to the same addresses.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Literal

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

Refusal = Literal["metadata", "unspecified", "loopback", "link_local", "private", "reserved"]
"""Why an address is refused (a metric's label, and the client's error message)."""

METADATA: frozenset[Address] = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean
        "169.254.170.2",  # AWS ECS task metadata
        "fd00:ec2::254",  # AWS over IPv6
        "100.100.100.200",  # Alibaba Cloud
        "192.0.0.192",  # Oracle Cloud
    )
)

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT (RFC 6598)
_NOT_PUBLIC: tuple[Network, ...] = tuple(
    ipaddress.ip_network(n)
    for n in (
        # Ranges that Python's tables (which vary by version) may take for global.
        "192.0.0.0/24",  # IETF protocol assignments
        "198.18.0.0/15",  # benchmarking
        "2001::/23",  # IETF protocol assignments (Teredo among them)
        "2001:db8::/32",  # documentation
        "3fff::/20",  # documentation
        "fec0::/10",  # site-local (deprecated)
        "100::/64",  # discard
    )
)
_LABEL = r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?"
_NAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")

REASONS: dict[Refusal, str] = {
    "metadata": "a cloud metadata address",
    "unspecified": "the unspecified address",
    "loopback": "a loopback address",
    "link_local": "a link-local address",
    "private": "a private address",
    "reserved": "an address that is not publicly routable",
}


def parse_address(text: str) -> Address | None:
    """`text` as an IP address (IPv6 in brackets or not, no zone), or None."""
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def carried(address: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 form carries and a connection may reach (mapped, NAT64,
    6to4, either end of Teredo's), or None."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]  # the client's end, where the traffic goes
    return None


def refusal(address: Address) -> Refusal | None:
    """Why `address` may not be fetched from (the allow-list aside), or None. An IPv6 form
    that carries an IPv4 address is refused when either is (a mapped one is its IPv4 address
    alone)."""
    inner = carried(address)
    if inner is not None:
        found = _refusal(inner)
        mapped = isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None
        if found is not None or mapped:
            return found
    return _refusal(address)


def _refusal(address: Address) -> Refusal | None:
    if address in METADATA:
        return "metadata"
    if address.is_unspecified:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link_local"
    if address.is_multicast or address.is_reserved:
        return "reserved"
    if address.is_private or (isinstance(address, ipaddress.IPv4Address) and address in _SHARED):
        return "private"
    if not address.is_global or any(address in network for network in _NOT_PUBLIC):
        return "reserved"
    return None


@dataclass(frozen=True, slots=True)
class AddressPolicy:
    """The allow-list, and the checks of names and addresses against it and `refusal`."""

    names: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = ()

    @classmethod
    def parse(cls, text: str) -> AddressPolicy:
        """From a comma-separated list of host names, addresses and CIDR ranges; ValueError
        names the entry that is none of them."""
        names: set[str] = set()
        networks: list[Network] = []
        for raw in text.split(","):
            entry = raw.strip()
            if not entry:
                continue
            address = parse_address(entry)
            if address is not None:
                networks.append(ipaddress.ip_network(address))
                continue
            if "/" in entry:
                try:
                    networks.append(ipaddress.ip_network(entry, strict=True))
                except ValueError as exc:
                    raise ValueError(f"{entry!r} is not a CIDR range: {exc}") from None
                continue
            name = entry.lower().rstrip(".")
            if not _NAME.match(name):
                raise ValueError(f"{entry!r} is not a host name, an address or a CIDR range")
            names.add(name)
        return cls(frozenset(names), tuple(networks))

    def allows_name(self, host: str) -> bool:
        """Whether `host` is allowed by name (then any address it resolves to is)."""
        return host.lower().rstrip(".") in self.names

    def check(self, address: Address) -> Refusal | None:
        """Why a connection to `address` is refused, or None: allowed by the list (the
        address itself, or a range it is in), or publicly routable."""
        if any(address in network for network in self.networks):
            return None
        mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
        if mapped is not None and any(mapped in network for network in self.networks):
            return None
        return refusal(address)
