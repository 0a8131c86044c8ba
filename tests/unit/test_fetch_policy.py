"""The SSRF policy of fetching by URL, decided from a URL and the addresses its host resolved to."""

from __future__ import annotations

import ipaddress

import pytest

from shared.config import ConfigError, load_settings
from shared.errors import ErrorCode, RaglineError
from shared.fetch.policy import (
    FetchPolicy,
    address_refusal,
    check_url,
    doc_id_for_url,
    name_of,
    parse_allow_entry,
)
from shared.models import check_doc_id
from workers.sniff import name_hint

DEFAULT = FetchPolicy.of([])


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


# Every class of address a fetch must not reach by default, with the name the refusal gives it.
REFUSED = {
    "127.0.0.1": "loopback",
    "127.8.9.10": "loopback",
    "::1": "loopback",
    "169.254.1.1": "link-local",
    "fe80::1": "link-local",
    "10.1.2.3": "private",
    "172.16.0.1": "private",
    "172.31.255.255": "private",
    "192.168.1.1": "private",
    "fd12:3456::1": "private",
    "fc00::1": "private",
    "100.64.0.1": "shared (carrier-grade NAT)",
    "100.127.255.254": "shared (carrier-grade NAT)",
    "0.0.0.0": "unspecified",  # noqa: S104  (an address judged, not bound)
    "::": "unspecified",
    "224.0.0.1": "multicast",
    "239.255.255.250": "multicast",
    "ff02::1": "multicast",
    "240.0.0.1": "private",  # reserved for future use; Python files it under private too
    "255.255.255.255": "private",
    "fec0::1": "site-local",
    "192.0.2.10": "private",  # documentation
    "2001:db8::1": "private",  # documentation
    "198.18.0.1": "private",  # benchmarking
    "169.254.169.254": "cloud metadata",
    "169.254.170.2": "cloud metadata",
    "fd00:ec2::254": "cloud metadata",
    "168.63.129.16": "cloud metadata",  # Azure's wire server: a public address otherwise
    "100.100.100.200": "cloud metadata",
    # IPv6 addresses that carry an IPv4 address are judged by it
    "::ffff:127.0.0.1": "loopback",
    "::ffff:10.0.0.1": "private",
    "::ffff:169.254.169.254": "cloud metadata",
    "64:ff9b::7f00:1": "loopback",  # NAT64
    "2002:c0a8:101::1": "private",  # 6to4 of 192.168.1.1
}
PUBLIC = ["8.8.8.8", "1.1.1.1", "93.184.215.14", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"]


@pytest.mark.parametrize(("address", "reason"), REFUSED.items())
def test_every_class_that_is_not_public_is_refused_with_its_name(address: str, reason: str) -> None:
    assert address_refusal(_ip(address)) == reason
    with pytest.raises(RaglineError) as refused:
        DEFAULT.check_addresses("host.example", [_ip(address)])
    assert refused.value.code == ErrorCode.FETCH_REFUSED
    assert reason in refused.value.message
    # The caller learns the class, never the address: no map of the internal network.
    assert address not in refused.value.message


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_reached(address: str) -> None:
    assert address_refusal(_ip(address)) is None
    DEFAULT.check_addresses("host.example", [_ip(address)])


def test_a_name_resolving_to_a_private_address_is_refused() -> None:
    with pytest.raises(RaglineError, match="private") as refused:
        DEFAULT.check_addresses("intranet.example.com", [_ip("10.20.30.40")])
    assert refused.value.code == ErrorCode.FETCH_REFUSED


def test_one_refused_address_among_public_ones_refuses_the_name() -> None:
    # The connection may go to any address the name has: a single private one is enough to refuse.
    with pytest.raises(RaglineError, match="loopback"):
        DEFAULT.check_addresses("rebind.example", [_ip("8.8.8.8"), _ip("127.0.0.1")])
    with pytest.raises(RaglineError, match="loopback"):
        DEFAULT.check_addresses("rebind.example", [_ip("2606:4700::1111"), _ip("::1")])


def test_the_allowlist_opens_named_networks_and_hosts_only() -> None:
    policy = FetchPolicy.of(["127.0.0.1", "10.20.0.0/16", "wiki.internal", "*.corp.example"])
    policy.check_addresses("anything", [_ip("127.0.0.1")])
    policy.check_addresses("anything", [_ip("::ffff:127.0.0.1")])  # the same address, mapped
    policy.check_addresses("anything", [_ip("10.20.9.9")])
    policy.check_addresses("wiki.internal", [_ip("192.168.3.3")])
    policy.check_addresses("docs.corp.example", [_ip("172.16.5.5")])
    for host, address in [
        ("anything", "127.0.0.2"),
        ("anything", "::1"),
        ("anything", "10.21.0.1"),
        ("corp.example", "172.16.5.5"),  # "*.corp.example" names the names under it
        ("wiki.internal.evil", "192.168.3.3"),
        ("evil-corp.example", "172.16.5.5"),
    ]:
        with pytest.raises(RaglineError) as refused:
            policy.check_addresses(host, [_ip(address)])
        assert refused.value.code == ErrorCode.FETCH_REFUSED, (host, address)


def test_metadata_stays_refused_whatever_the_allowlist_says() -> None:
    policy = FetchPolicy.of(["169.254.0.0/16", "169.254.169.254", "0.0.0.0/0", "::/0", "meta.example"])
    for address in ["169.254.169.254", "::ffff:169.254.169.254", "fd00:ec2::254", "168.63.129.16"]:
        with pytest.raises(RaglineError, match="cloud metadata"):
            policy.check_addresses("meta.example", [_ip(address)])
    policy.check_addresses("meta.example", [_ip("169.254.1.1")])  # the rest of the range is allowed
    for url in ["http://metadata.google.internal/computeMetadata/v1/", "http://METADATA.goog./x"]:
        with pytest.raises(RaglineError, match="metadata") as refused:
            FetchPolicy.of(["metadata.google.internal", "metadata.goog"]).check_name(check_url(url))
        assert refused.value.code == ErrorCode.FETCH_REFUSED


@pytest.mark.parametrize(
    "url",
    [
        "http://2130706433/",  # 127.0.0.1 as one decimal number
        "http://017700000001/",  # octal
        "http://0x7f000001/",  # hexadecimal
        "http://0x7f.1/",
        "http://127.1/",
        "http://127.0.1/",
        "http://0177.0.0.1/",
        "http://127.000.000.001/",  # leading zeros: octal to some resolvers
        "http://0/",
    ],
)
def test_other_spellings_of_an_ipv4_address_are_refused_before_any_lookup(url: str) -> None:
    with pytest.raises(RaglineError, match="four decimal numbers") as refused:
        check_url(url)
    assert refused.value.code == ErrorCode.FETCH_REFUSED


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:8000/admin", "loopback"),
        ("http://[::1]/", "loopback"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://[::ffff:7f00:1]/", "loopback"),
        ("https://10.0.0.1/x", "private"),
        ("http://169.254.169.254/latest/meta-data/", "cloud metadata"),
        ("http://[fd00:ec2::254]/", "cloud metadata"),
        ("http://100.64.1.1/", "carrier-grade NAT"),
        ("http://0.0.0.0:9200/", "unspecified"),
    ],
)
def test_an_ip_literal_is_judged_from_the_url_alone(url: str, reason: str) -> None:
    with pytest.raises(RaglineError, match=reason) as refused:
        DEFAULT.check_name(check_url(url))
    assert refused.value.code == ErrorCode.FETCH_REFUSED


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "gopher://example.com/", "ftp://example.com/a", "javascript:alert(1)"]
)
def test_only_http_and_https_are_fetched(url: str) -> None:
    with pytest.raises(RaglineError, match="only http and https") as refused:
        check_url(url)
    assert refused.value.code == ErrorCode.FETCH_REFUSED


@pytest.mark.parametrize(
    "url",
    [
        "http://user:secret@example.com/",
        "http://user@example.com/",
        "http:///nohost",
        "http://exa mple.com/",
        " http://example.com/",
        "http://example.com/\nX-Injected: 1",
        "http://ex%61mple.com/",
        "http://-example.com/",
        "http://example..com/",
        "http://1.2.3.4.5/",
        "http://[::1%25eth0]/",
        "http://" + "a" * 64 + ".example/",
        "http://example.com/" + "a" * 2048,
        "not a url",
        "http://[]/",  # found by fuzzing: both URL parsers refuse these, neither may escape
        "http://:[/",
        "http://a:[]/",
    ],
)
def test_malformed_urls_are_invalid_arguments(url: str) -> None:
    with pytest.raises(RaglineError) as invalid:
        check_url(url)
    assert invalid.value.code in (ErrorCode.INVALID_ARGUMENT, ErrorCode.FETCH_REFUSED)
    assert invalid.value.details == {"field": "url"}


def test_a_good_url_is_normalized() -> None:
    target = check_url("https://Docs.Example.COM./guide/page.html?x=1#section")
    assert (target.host, target.port, target.literal) == ("docs.example.com", 443, None)
    assert target.text == "https://docs.example.com./guide/page.html?x=1"
    assert check_url("http://bücher.example/").host == "xn--bcher-kva.example"
    assert check_url("http://[2606:4700::1111]:8080/").literal == _ip("2606:4700::1111")
    assert check_url("http://8.8.8.8/").literal == _ip("8.8.8.8")


@pytest.mark.parametrize(
    ("url", "doc_id"),
    [
        ("https://Example.com/docs/page.html?x=1&y=2#frag", "example.com/docs/page.html-x-1-y-2"),
        ("http://example.com/docs/page.html", "example.com/docs/page.html"),
        ("https://example.com/", "example.com"),
        ("http://h.example:8080/a/b.md", "h.example-8080/a/b.md"),
        ("http://127.0.0.1:9/guide.md", "127.0.0.1-9/guide.md"),
        ("http://example.com/a/../b/./c", "example.com/b/c"),
        ("http://example.com/%E2%9C%93.txt", "example.com/-E2-9C-93.txt"),
    ],
)
def test_a_url_gives_a_stable_document_id(url: str, doc_id: str) -> None:
    assert doc_id_for_url(url) == doc_id
    assert check_doc_id(doc_id) == doc_id


def test_long_urls_keep_distinct_ids_within_the_limit() -> None:
    first = doc_id_for_url("https://example.com/" + "a/" * 150 + "one")
    second = doc_id_for_url("https://example.com/" + "a/" * 150 + "two")
    assert first != second
    assert len(first) <= 200
    assert check_doc_id(first) == first


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("http://example.com/a/report.md?download=1", "report.md"),
        ("http://example.com/a/my%20notes.txt", "my notes.txt"),
        ("http://example.com/", None),
        ("http://example.com", None),
        ("http://example.com/dir/", None),
    ],
)
def test_the_name_of_a_url_is_its_last_path_segment(url: str, name: str | None) -> None:
    assert name_of(url) == name


@pytest.mark.parametrize(
    ("name", "declared", "seen"),
    [
        ("notes", "text/markdown", "notes.md"),
        (None, "text/markdown", "document.md"),
        ("notes.md", "text/markdown", "notes.md"),
        ("table", "text/csv", "table.csv"),
        ("page.html", "text/plain", "page.html"),  # the bytes say HTML; the type changes nothing
        ("report", "application/pdf", "report"),
        ("readme", None, "readme"),
    ],
)
def test_a_declared_markdown_or_csv_type_stands_in_for_the_extension(
    name: str | None, declared: str | None, seen: str
) -> None:
    assert name_hint(name, declared) == seen


@pytest.mark.parametrize(
    "entry", ["127.0.0.1", "10.0.0.0/8", "::1", "fd00::/8", "wiki.internal", "*.corp.example"]
)
def test_allowlist_entries_are_hosts_addresses_or_networks(entry: str) -> None:
    parse_allow_entry(entry)
    assert load_settings(fetch={"allow": [entry]}).fetch.allow == [entry]


@pytest.mark.parametrize("entry", ["not a host", "http://example.com", "10.0.0.0/33", "*", ""])
def test_a_bad_allowlist_entry_fails_at_startup(entry: str) -> None:
    with pytest.raises(ConfigError, match="RAGLINE_FETCH__ALLOW"):
        load_settings(fetch={"allow": [entry]})
