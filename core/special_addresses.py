"""IANA's special-purpose address ranges: where a webhook may never be sent (unless private ones are allowed).

The tables are IANA's IPv4 and IPv6 Special-Purpose Address Registries, with the registries' own names
(https://www.iana.org/assignments/iana-ipv4-special-registry/ and .../iana-ipv6-special-registry/, as of
2025), plus multicast and, for IPv6, everything outside Global Unicast 2000::/3 (IANA's IPv4 and IPv6
Address Space registries). Every range is blocked, those the registries mark globally reachable included
(anycast relays, AS112, AMT): no webhook endpoint lives there. IPv4-mapped (::ffff:0:0/96) and NAT64
(64:ff9b::/96) addresses are judged by the IPv4 address they carry, as that is where they lead; 6to4 and
Teredo, deprecated, are blocked whole.
"""

from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_network

Address = IPv4Address | IPv6Address


@dataclass(frozen=True)
class SpecialRange:
    network: IPv4Network | IPv6Network
    name: str
    source: str

    def __str__(self) -> str:
        return f"{self.name} ({self.network}, {self.source})"


def _table(*rows: tuple[str, str, str]) -> tuple[SpecialRange, ...]:
    return tuple(SpecialRange(ip_network(prefix), name, source) for prefix, name, source in rows)


IPV4_SPECIAL = _table(
    ("0.0.0.0/8", '"This network"', "RFC 791"),
    ("0.0.0.0/32", '"This host on this network"', "RFC 1122"),
    ("10.0.0.0/8", "Private-Use", "RFC 1918"),
    ("100.64.0.0/10", "Shared Address Space", "RFC 6598"),
    ("127.0.0.0/8", "Loopback", "RFC 1122"),
    ("169.254.0.0/16", "Link Local", "RFC 3927"),
    ("172.16.0.0/12", "Private-Use", "RFC 1918"),
    ("192.0.0.0/24", "IETF Protocol Assignments", "RFC 6890"),
    ("192.0.0.0/29", "IPv4 Service Continuity Prefix", "RFC 7335"),
    ("192.0.0.8/32", "IPv4 dummy address", "RFC 7600"),
    ("192.0.0.9/32", "Port Control Protocol Anycast", "RFC 7723"),
    ("192.0.0.10/32", "Traversal Using Relays around NAT Anycast", "RFC 8155"),
    ("192.0.0.170/32", "NAT64/DNS64 Discovery", "RFC 8880"),
    ("192.0.0.171/32", "NAT64/DNS64 Discovery", "RFC 8880"),
    ("192.0.2.0/24", "Documentation (TEST-NET-1)", "RFC 5737"),
    ("192.31.196.0/24", "AS112-v4", "RFC 7535"),
    ("192.52.193.0/24", "AMT", "RFC 7450"),
    ("192.88.99.0/24", "Deprecated (6to4 Relay Anycast)", "RFC 7526"),
    ("192.88.99.2/32", "6a44-relay anycast address", "RFC 6751"),
    ("192.168.0.0/16", "Private-Use", "RFC 1918"),
    ("192.175.48.0/24", "Direct Delegation AS112 Service", "RFC 7534"),
    ("198.18.0.0/15", "Benchmarking", "RFC 2544"),
    ("198.51.100.0/24", "Documentation (TEST-NET-2)", "RFC 5737"),
    ("203.0.113.0/24", "Documentation (TEST-NET-3)", "RFC 5737"),
    ("224.0.0.0/4", "Multicast", "RFC 5771, IANA IPv4 Address Space"),
    ("240.0.0.0/4", "Reserved", "RFC 1112"),
    ("255.255.255.255/32", "Limited Broadcast", "RFC 919"),
)

IPV6_SPECIAL = _table(
    ("::1/128", "Loopback Address", "RFC 4291"),
    ("::/128", "Unspecified Address", "RFC 4291"),
    ("::ffff:0:0/96", "IPv4-mapped Address", "RFC 4291"),
    ("64:ff9b::/96", "IPv4-IPv6 Translat.", "RFC 6052"),
    ("64:ff9b:1::/48", "IPv4-IPv6 Translat.", "RFC 8215"),
    ("100::/64", "Discard-Only Address Block", "RFC 6666"),
    ("100:0:0:1::/64", "Dummy IPv6 Prefix", "RFC 9780"),
    ("2001::/23", "IETF Protocol Assignments", "RFC 2928"),
    ("2001::/32", "TEREDO", "RFC 4380"),
    ("2001:1::1/128", "Port Control Protocol Anycast", "RFC 7723"),
    ("2001:1::2/128", "Traversal Using Relays around NAT Anycast", "RFC 8155"),
    ("2001:1::3/128", "DNS-SD Service Registration Protocol Anycast Address", "RFC 9665"),
    ("2001:2::/48", "Benchmarking", "RFC 5180"),
    ("2001:3::/32", "AMT", "RFC 7450"),
    ("2001:4:112::/48", "AS112-v6", "RFC 7535"),
    ("2001:10::/28", "Deprecated (previously ORCHID)", "RFC 4843"),
    ("2001:20::/28", "ORCHIDv2", "RFC 7343"),
    ("2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix", "RFC 9374"),
    ("2001:db8::/32", "Documentation", "RFC 3849"),
    ("2002::/16", "6to4", "RFC 3056"),
    ("2620:4f:8000::/48", "Direct Delegation AS112 Service", "RFC 7534"),
    ("3fff::/20", "Documentation", "RFC 9637"),
    ("5f00::/16", "Segment Routing (SRv6) SIDs", "RFC 9602"),
    ("fc00::/7", "Unique-Local", "RFC 4193"),
    ("fe80::/10", "Link-Local Unicast", "RFC 4291"),
    ("ff00::/8", "Multicast", "RFC 4291, IANA IPv6 Address Space"),
)

GLOBAL_UNICAST = ip_network("2000::/3")
NOT_GLOBAL_UNICAST = SpecialRange(GLOBAL_UNICAST, "outside Global Unicast", "IANA IPv6 Address Space")
CARRIES_IPV4 = (ip_network("::ffff:0:0/96"), ip_network("64:ff9b::/96"))  # judged by their IPv4 address

# The most specific range first, so that an address is named by its narrowest registry entry.
_BY_SPECIFICITY = sorted(IPV4_SPECIAL + IPV6_SPECIAL, key=lambda r: -r.network.prefixlen)


def special_range(address: Address) -> SpecialRange | None:
    """The special-purpose range ``address`` lies in (for an IPv4-mapped or NAT64 address, the range of
    the IPv4 address it carries), or None for an ordinary public address."""
    if isinstance(address, IPv6Address):
        address = IPv6Address(int(address))  # without a scope id (fe80::1%eth0)
        if any(address in network for network in CARRIES_IPV4):
            return special_range(IPv4Address(int(address) & 0xFFFF_FFFF))
    for special in _BY_SPECIFICITY:
        if address.version == special.network.version and address in special.network:
            return special
    if isinstance(address, IPv6Address) and address not in GLOBAL_UNICAST:
        return NOT_GLOBAL_UNICAST
    return None
