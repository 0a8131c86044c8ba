"""Which URLs and addresses a fetch may reach: the SSRF policy, as pure functions of what was resolved.

A URL given to Ragline is fetched by a worker inside the deployment's network, so a caller could
aim it at what only that network reaches: the loopback interface, private and link-local networks,
and above all the cloud metadata service, which hands out credentials. The rules:

- only `http` and `https`, no credentials in the URL, and a host that is a plain DNS name or an IP
  address in its standard spelling (`2130706433`, `0x7f.1` and `127.1` all mean 127.0.0.1 to the
  system resolver, so they are refused instead of being resolved);
- every address the host resolves to must be public: one refused address refuses the URL, since the
  connection could go to any of them; IPv6 addresses that carry an IPv4 address (mapped, NAT64,
  6to4) are judged by that address;
- `fetch.allow` names hosts and networks that may be reached all the same (an intranet wiki);
- cloud metadata addresses and names are refused whatever the allowlist says.

The fetcher (shared/fetch/client.py) applies this to the URL and to every redirect, after
resolving the host, and then connects to the address it checked. The messages name the class of
address refused, never the address: a caller must not learn the internal network's layout from them.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import httpx

from shared.errors import ErrorCode, PermanentError
from shared.models import safe_doc_id

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_URL_CHARS = 2048
SCHEMES = ("http", "https")
# The instance metadata services of the clouds (AWS, GCP, Azure, Oracle, OpenStack: 169.254.169.254;
# AWS over IPv6; ECS task metadata; Azure's wire server; Alibaba). Most lie in ranges refused anyway;
# naming them keeps them refused when an operator allows a whole range around them.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",
        "169.254.170.2",
        "169.254.170.23",
        "168.63.129.16",
        "100.100.100.200",
        "fd00:ec2::254",
        "fd00:ec2::23",
    )
)
METADATA_HOSTS = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "instance-data",
        "instance-data.ec2.internal",
        "metadata.tencentyun.com",
    }
)
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
_DOTTED_QUAD = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")
_NUMERIC_SPELLING = "IPv4 addresses must be written as four decimal numbers without leading zeros"


def refused(message: str) -> PermanentError:
    return PermanentError(message, code=ErrorCode.FETCH_REFUSED, details={"field": "url"})


def _invalid(problem: str) -> PermanentError:
    return PermanentError(f"url {problem}", code=ErrorCode.INVALID_ARGUMENT, details={"field": "url"})


@dataclass(frozen=True)
class Target:
    """A URL that passed the syntax rules: what the fetcher connects to and asks for."""

    url: httpx.URL  # without its fragment
    host: str  # ASCII (IDNA), lower case, without a trailing dot
    port: int
    literal: IPAddress | None  # the host, when it is an IP address

    @property
    def text(self) -> str:
        return str(self.url)


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries to its destination: mapped, NAT64, 6to4."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


def address_refusal(address: IPAddress) -> str | None:
    """The class of address that refuses `address` ("loopback", ...), or None for a public one."""
    inner = embedded_ipv4(address)
    if inner is not None:
        return address_refusal(inner)
    if address in METADATA_ADDRESSES:
        return "cloud metadata"
    checks: list[tuple[bool, str]] = [
        (address.is_unspecified, "unspecified"),
        (address.is_loopback, "loopback"),
        (address.is_link_local, "link-local"),
        (address.is_multicast, "multicast"),
        (address in _CGNAT, "shared (carrier-grade NAT)"),
        (address.is_private, "private"),
        (address.is_reserved, "reserved"),
        (isinstance(address, ipaddress.IPv6Address) and address.is_site_local, "site-local"),
        (not address.is_global, "non-public"),
    ]
    return next((name for hit, name in checks if hit), None)


def parse_allow_entry(entry: str) -> IPNetwork | str:
    """An allowlist entry: a network (an address is a network of one) or a host name pattern."""
    text = entry.strip().lower()
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        pass
    name = text[2:] if text.startswith("*.") else text
    if not _is_host_name(name):
        raise ValueError(f"not a host name, address or CIDR: {entry!r}")
    return text


@dataclass(frozen=True)
class FetchPolicy:
    """The addresses a fetch may reach: public ones, and those the allowlist names."""

    hosts: tuple[str, ...] = ()  # exact names, or "*.suffix" for any name under suffix
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def of(cls, allow: Iterable[str]) -> FetchPolicy:
        entries = [parse_allow_entry(e) for e in allow]
        return cls(
            hosts=tuple(e for e in entries if isinstance(e, str)),
            networks=tuple(e for e in entries if not isinstance(e, str)),
        )

    def allows_host(self, host: str) -> bool:
        return any(
            host == pattern or (pattern.startswith("*.") and host.endswith(pattern[1:]))
            for pattern in self.hosts
        )

    def refusal(self, host: str, address: IPAddress) -> str | None:
        """Why `address` (which `host` resolved to) may not be reached, or None."""
        if address in METADATA_ADDRESSES or embedded_ipv4(address) in METADATA_ADDRESSES:
            return "cloud metadata"
        reason = address_refusal(address)
        if reason is None or self.allows_host(host):
            return None
        inner = embedded_ipv4(address)
        if any(address in net or (inner is not None and inner in net) for net in self.networks):
            return None
        return reason

    def check_name(self, target: Target) -> None:
        """Refuse what the URL's host says before anything is resolved: metadata names, and an IP
        address that the policy refuses (the API checks this much; the worker checks again)."""
        if target.host in METADATA_HOSTS:
            raise refused("the URL names a cloud metadata service, which is never fetched")
        if target.literal is not None:
            self.check_addresses(target.host, [target.literal])

    def check_addresses(self, host: str, addresses: Iterable[IPAddress]) -> None:
        """FETCH_REFUSED unless every address `host` resolved to may be reached."""
        for address in addresses:
            reason = self.refusal(host, address)
            if reason is not None:
                raise refused(
                    f"the URL's host is or resolves to a {reason} address, which the fetch policy "
                    "refuses (an operator may allow it: RAGLINE_FETCH__ALLOW)"
                )


def _is_host_name(name: str) -> bool:
    labels = name.split(".")
    # A name whose last label is a number reads as an IPv4 address to some resolvers.
    return 0 < len(name) <= 253 and all(_LABEL.match(label) for label in labels) and not labels[-1].isdigit()


def _plain_host(url: str) -> str:
    """The host as the standard library reads it, or "" where it cannot."""
    try:
        return urlsplit(url).hostname or ""
    except ValueError:
        return ""


def _looks_numeric(host: str) -> bool:
    """Whether the system resolver would read `host` as an IPv4 address in some spelling."""
    try:
        socket.inet_aton(host)
    except OSError:
        return False
    return True


def check_url(url: str) -> Target:
    """The URL as a fetch target, or INVALID_ARGUMENT / FETCH_REFUSED saying what is wrong.

    Syntax and scheme only; addresses are the policy's (`FetchPolicy`).
    """
    if len(url) > MAX_URL_CHARS:
        raise _invalid(f"is longer than {MAX_URL_CHARS} characters")
    if url != url.strip() or any(ord(c) < 33 or ord(c) == 127 for c in url):
        raise _invalid("holds whitespace or control characters")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, UnicodeError, ValueError):
        # httpx refuses some numeric spellings itself ("0177.0.0.1"): say what is wrong with them.
        if _looks_numeric(_plain_host(url)):
            raise refused(_NUMERIC_SPELLING) from None
        raise _invalid("is not a valid URL") from None
    if parsed.scheme not in SCHEMES:
        raise refused("only http and https URLs are fetched")
    if parsed.userinfo:
        raise _invalid("may not carry a user name or password (they would be stored and shown)")
    raw_host = parsed.raw_host.decode("ascii", "replace").lower()
    if not raw_host:
        raise _invalid("has no host")
    host = raw_host.rstrip(".") if not raw_host.endswith("..") else raw_host
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    return Target(url=parsed.copy_with(fragment=None), host=host, port=port, literal=_literal(host))


def _literal(host: str) -> IPAddress | None:
    """The address a host is, when it is an IP address; None for a valid host name."""
    if ":" in host:  # httpx gives an IPv6 literal without its brackets
        if "%" in host:
            raise _invalid("has an IPv6 zone id, which is not accepted")
        try:
            return ipaddress.IPv6Address(host)
        except ValueError:
            raise _invalid("has an invalid IPv6 address") from None
    if _DOTTED_QUAD.match(host):
        try:
            return ipaddress.IPv4Address(host)
        except ValueError:
            raise refused(_NUMERIC_SPELLING) from None
    if _looks_numeric(host):
        raise refused(_NUMERIC_SPELLING)
    if not _is_host_name(host):
        raise _invalid("has an invalid host name")
    return None


def doc_id_for_url(url: str) -> str:
    """The document id of a URL ingested without one: host, port, path and query, made id-safe.

    The scheme is left out, so http and https of one page are one document. A URL longer than an
    id may be is cut and given a digest of the whole, so two long URLs never share an id.
    """
    target = check_url(url)
    port = f"-{target.url.port}" if target.url.port else ""
    path = target.url.raw_path.decode("ascii", "replace")
    raw = f"{target.host}{port}{path}"
    cleaned = safe_doc_id(raw)
    if len(cleaned) < 180:
        return cleaned
    digest = hashlib.sha256(target.text.encode()).hexdigest()[:16]
    return f"{safe_doc_id(raw)[:180].rstrip('-/.')}-{digest}"


def name_of(url: str) -> str | None:
    """The file name a URL's path ends with (a label, and a hint between text kinds), if any."""
    path = httpx.URL(url).path
    base = unquote(path).rsplit("/", 1)[-1]
    cleaned = "".join(c for c in base if c.isprintable()).strip(" .")
    return cleaned[:255] or None
