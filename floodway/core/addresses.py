"""Which network addresses floodway calls on a caller's behalf (a task's ``callback_url``).

The outbox POSTs from inside the deployment's network, so a caller who could name any address
could reach what only that network reaches: an admin port on loopback, a database's HTTP
port on a private range, a cloud's metadata endpoint. Only public (globally routed, unicast)
addresses are called unless the operator lists the host in ``api.callback_hosts``.
"""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_CGNAT = ipaddress.ip_network("100.64.0.0/10")


def literal_address(host: str) -> IPAddress | None:
    """The address a URL's host spells literally (``[::1]`` without its brackets), else None."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def refusal(address: IPAddress) -> str | None:
    """What kind of non-public address this is ("a loopback address", ...), or None when it
    is a public one. An IPv4 address written as IPv6 (``::ffff:127.0.0.1``) is judged as
    the IPv4 address it reaches."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address (cloud metadata lives there)"
    if address.is_multicast:
        return "a multicast address"
    if isinstance(address, ipaddress.IPv4Address) and address in _CGNAT:
        return "a carrier-grade NAT address"
    if address.is_private:
        return "a private address"
    if not address.is_global:
        return "a reserved address"
    return None
