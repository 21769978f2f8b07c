"""Which addresses a callback may reach (floodway.core.addresses) and how the outbox pins the
address it checked."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from floodway.core.addresses import refusal
from floodway.core.errors import InvalidInput
from floodway.core.validation import check_callback_host
from floodway.maintenance.outbox import Refused, pinned_request

INSIDE = [
    "127.0.0.0/8",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "169.254.0.0/16",
    "100.64.0.0/10",
    "224.0.0.0/4",
    "0.0.0.0/32",
]


@given(st.sampled_from(INSIDE), st.integers(min_value=0))
def test_every_address_of_an_internal_range_is_refused(network: str, offset: int) -> None:
    net = ipaddress.ip_network(network)
    address = net[offset % net.num_addresses]
    assert refusal(address) is not None


@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_an_ipv4_address_written_as_ipv6_is_judged_as_itself(value: int) -> None:
    v4 = ipaddress.IPv4Address(value)
    mapped = ipaddress.IPv6Address(f"::ffff:{v4}")
    assert (refusal(v4) is None) == (refusal(mapped) is None)


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700::1111"])
def test_public_addresses_are_called(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize("address", ["::1", "fe80::1", "fd00:ec2::254", "::", "ff02::1"])
def test_internal_ipv6_addresses_are_refused(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is not None


def test_a_listed_host_may_be_internal_and_an_unlisted_one_is_refused() -> None:
    check_callback_host("http://127.0.0.1:9000/hook", ["127.0.0.1"])
    check_callback_host("https://hooks.example.com/x", [])  # a name: checked at delivery
    with pytest.raises(InvalidInput, match="loopback"):
        check_callback_host("http://127.0.0.1:9000/hook", [])
    with pytest.raises(InvalidInput, match="not allowed here"):
        check_callback_host("https://other.example/x", ["hooks.example.com"])


def resolving_to(monkeypatch: pytest.MonkeyPatch, *addresses: str) -> None:
    """The event loop's resolver answers ``addresses`` for any name (no DNS in tests)."""

    async def getaddrinfo(host: str, port: int, **_: Any) -> list[Any]:
        family = socket.AF_INET6
        return [
            (socket.AF_INET if "." in a else family, socket.SOCK_STREAM, 6, "", (a, port))
            for a in addresses
        ]

    loop = asyncio.get_running_loop()
    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)


async def test_a_public_name_is_called_at_the_address_that_was_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resolving_to(monkeypatch, "93.184.216.34")
    url, headers, extensions = await pinned_request("https://hooks.example.com:8443/x?a=1", [])
    assert str(url) == "https://93.184.216.34:8443/x?a=1"
    assert headers == {"host": "hooks.example.com:8443"}
    assert extensions == {"sni_hostname": "hooks.example.com"}


async def test_a_name_with_any_internal_address_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resolving_to(monkeypatch, "93.184.216.34", "10.0.0.5")
    with pytest.raises(Refused, match="private"):
        await pinned_request("http://hooks.example.com/x", [])
    url, headers, _ = await pinned_request("http://hooks.example.com/x", ["*.example.com"])
    assert str(url) == "http://hooks.example.com/x" and headers == {}
