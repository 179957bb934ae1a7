"""The media policy's address check, on every kind of address it refuses: checked here, on the
check itself, never by sending such a URL anywhere (a bug would send traffic off the machine)."""

from __future__ import annotations

import ipaddress

import pytest

from sluicegate.media.policy import AddressPolicy, parse_address, refusal

REFUSED = {
    "metadata": [
        "169.254.169.254",
        "169.254.170.2",
        "fd00:ec2::254",
        "100.100.100.200",
        "192.0.0.192",
        "::ffff:169.254.169.254",
    ],
    "unspecified": ["0.0.0.0", "::", "::ffff:0.0.0.0"],
    "loopback": [
        "127.0.0.1",
        "127.255.0.9",
        "::1",
        "::ffff:127.0.0.1",  # IPv4-mapped
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "2002:7f00:1::1",  # 6to4 of 127.0.0.1
        "2001:0:808:808:0:f227:80ff:fffe",  # Teredo: server 8.8.8.8, client 127.0.0.1
    ],
    "link_local": ["169.254.0.1", "169.254.255.1", "fe80::1"],
    "private": [
        "10.0.0.1",
        "10.255.255.255",
        "172.16.0.1",
        "172.31.255.254",
        "192.168.1.1",
        "fc00::1",
        "fd12:3456::1",
        "100.64.0.1",  # carrier-grade NAT
        "::ffff:10.1.2.3",
        "2001:0:808:808:0:f227:f7f7:f7f7",  # Teredo, both ends public: IETF's range
    ],
    "reserved": [
        "240.0.0.1",
        "224.0.0.1",
        "239.255.255.250",
        "ff02::1",
        "255.255.255.255",
        # Ranges Python's tables (by version) may take for global.
        "192.0.0.8",
        "fec0::1",
        "3fff::1",
        "64:ff9b:1::1",  # local-use NAT64
    ],
}
PUBLIC = ["8.8.8.8", "1.1.1.1", "93.184.215.14", "2606:4700:4700::1111", "::ffff:8.8.4.4"]


@pytest.mark.parametrize(
    ("text", "kind"), [(text, kind) for kind, texts in REFUSED.items() for text in texts]
)
def test_every_kind_of_inner_address_is_refused_by_kind(text: str, kind: str) -> None:
    address = ipaddress.ip_address(text)
    assert refusal(address) == kind
    assert AddressPolicy().check(address) == kind


@pytest.mark.parametrize("text", PUBLIC)
def test_public_addresses_are_fetched_from(text: str) -> None:
    assert AddressPolicy().check(ipaddress.ip_address(text)) is None


def test_an_allowed_address_allows_only_itself() -> None:
    policy = AddressPolicy.parse("127.0.0.2")
    assert policy.check(ipaddress.ip_address("127.0.0.2")) is None
    assert policy.check(ipaddress.ip_address("::ffff:127.0.0.2")) is None
    assert policy.check(ipaddress.ip_address("127.0.0.1")) == "loopback"
    assert policy.check(ipaddress.ip_address("127.0.0.3")) == "loopback"
    assert policy.check(ipaddress.ip_address("169.254.169.254")) == "metadata"


def test_an_allowed_address_allows_no_ipv6_form_but_its_mapped_one() -> None:
    policy = AddressPolicy.parse("8.8.8.8,127.0.0.1")
    assert policy.check(ipaddress.ip_address("::ffff:127.0.0.1")) is None
    for carrier in ("2001:0:808:808:0:f227:f7f7:f7f7", "2002:7f00:1::1", "64:ff9b::7f00:1"):
        assert policy.check(ipaddress.ip_address(carrier)) is not None, carrier


def test_an_allowed_range_allows_its_members_and_nothing_around_it() -> None:
    policy = AddressPolicy.parse(" 10.1.0.0/16 , fd00:1::/64")
    assert policy.check(ipaddress.ip_address("10.1.200.3")) is None
    assert policy.check(ipaddress.ip_address("10.2.0.1")) == "private"
    assert policy.check(ipaddress.ip_address("fd00:1::5")) is None
    assert policy.check(ipaddress.ip_address("fd00:2::5")) == "private"


def test_an_allowed_name_is_matched_whole_and_without_case() -> None:
    policy = AddressPolicy.parse("Images.Internal.,[::1]")
    assert policy.allows_name("images.internal")
    assert policy.allows_name("IMAGES.internal.")
    assert not policy.allows_name("evil.images.internal")
    assert not policy.allows_name("images.internal.evil")
    assert policy.check(ipaddress.ip_address("::1")) is None
    # A name allows what it resolves to, not addresses as such.
    assert AddressPolicy.parse("localhost").check(ipaddress.ip_address("127.0.0.1")) == "loopback"


@pytest.mark.parametrize(
    "entry", ["10.0.0.1/8", "not a name", "exa mple.com", "-bad-.com", "1.2.3.4/40"]
)
def test_an_entry_that_is_no_name_address_or_range_stops_the_parse(entry: str) -> None:
    with pytest.raises(ValueError, match="is not"):
        AddressPolicy.parse(f"images.example.com,{entry}")


def test_empty_entries_are_ignored() -> None:
    assert AddressPolicy.parse(" , ,") == AddressPolicy()


def test_addresses_are_read_in_brackets_and_without_and_nothing_else_is_one() -> None:
    assert parse_address("[::1]") == ipaddress.ip_address("::1")
    assert parse_address("127.0.0.1") == ipaddress.ip_address("127.0.0.1")
    assert parse_address("localhost") is None
    assert parse_address("2130706433") is None  # a number is a name to this check
