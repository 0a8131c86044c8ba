"""The fetcher: one HTTP(S) GET of a URL under the SSRF policy (shared/fetch/policy.py) and its limits.

What it guarantees, for the worker's fetch stage and for any crawler built on it:

- the host is resolved here, every address checked, and the connection made to the checked address
  (the URL is rewritten to it; the Host header and the TLS server name stay the host's, so virtual
  hosts and certificates work): a DNS answer that changes between the check and the connection
  (DNS rebinding) cannot move it elsewhere. No proxy from the environment is used, and no
  connection is kept for another request, which could carry another host's name;
- redirects are followed here, each one checked like the URL, up to `fetch.max_redirects`;
- the body is counted as it streams, after decompression, and refused past the size limit whatever
  Content-Length said; gzip and deflate are inflated a bounded piece at a time, so a compression
  bomb never fills memory;
- connect and read timeouts bound each step, and `fetch.timeout_s` the whole fetch (checked between
  reads, so it may run over by one read timeout at most);
- conditional requests: given an ETag or a Last-Modified, a 304 answer says "not modified".

Failures carry stable codes: FETCH_REFUSED (the policy), FETCH_FAILED (the server or the network;
retryable when the target may recover: connection refused or timed out, 429, 5xx), TOO_LARGE,
TIMEOUT (the server stalled, or the fetch outlasted its limit). No message repeats what the server
sent: bodies and headers are the server's content, not the caller's business.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import ssl
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx

from shared.config import FetchSettings
from shared.errors import ErrorCode, PermanentError, RaglineError, TransientError
from shared.fetch.policy import FetchPolicy, IPAddress, Target, check_url, refused

log = logging.getLogger(__name__)

REDIRECTS = frozenset({301, 302, 303, 307, 308})
# Answers worth asking again later: the server is overloaded, restarting or rate-limiting.
RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
_INFLATE_STEP = 1 << 16
_MAX_HEADER_CHARS = 1024

Resolver = Callable[[str, int], list[IPAddress]]


def failed(message: str, *, retryable: bool = False, status: int | None = None) -> RaglineError:
    """FETCH_FAILED: retried with the stage's backoff when the target may recover. `status` is the
    HTTP status the server answered, when it answered one (a crawler tells 404 from 503 by it)."""
    details = {"status": status} if status is not None else None
    if retryable:
        return TransientError(message, code=ErrorCode.FETCH_FAILED, details=details)
    return PermanentError(message, code=ErrorCode.FETCH_FAILED, details=details)


def _timed_out(message: str) -> PermanentError:
    return PermanentError(message, code=ErrorCode.TIMEOUT)


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address the system resolver gives for `host`, in its order, without duplicates."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        gone = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}
        if error.errno in gone:
            raise failed("the URL's host name does not resolve") from None
        raise failed("the URL's host name could not be resolved", retryable=True) from None
    found: list[IPAddress] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if address not in found:
            found.append(address)
    if not found:
        raise failed("the URL's host name does not resolve")
    return found


@dataclass(frozen=True)
class Validators:
    """What a previous answer said of its bytes, sent back to ask "changed since?"."""

    etag: str | None = None
    last_modified: str | None = None

    def headers(self) -> dict[str, str]:
        sent = {}
        if self.etag:
            sent["If-None-Match"] = self.etag
        if self.last_modified:
            sent["If-Modified-Since"] = self.last_modified
        return sent


@dataclass(frozen=True)
class Fetched:
    """The answer of a fetch: where redirects ended, what the server said of the body, the body."""

    url: str
    not_modified: bool
    content_type: str | None  # the media type the server declared, without parameters
    validators: Validators
    body: Iterator[bytes]  # limits enforced while it is read; empty when not modified


class _Inflater:
    """Content-Encoding undone a bounded piece at a time (httpx would inflate a chunk whole)."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        if encoding in ("", "identity"):
            self._zlib = None
        elif encoding in ("gzip", "x-gzip"):
            self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._zlib = zlib.decompressobj()
        else:
            raise failed("the server sent the body in a content encoding Ragline does not read")
        self._first = True

    def feed(self, data: bytes) -> Iterator[bytes]:
        if self._zlib is None:
            yield data
            return
        try:
            while data:
                out = self._zlib.decompress(data, _INFLATE_STEP)
                self._first = False
                yield out
                data = self._zlib.unconsumed_tail
        except zlib.error:
            if self.encoding == "deflate" and self._first:
                # "deflate" is often sent raw, without its zlib header (as httpx also accepts)
                self._zlib, self._first = zlib.decompressobj(-zlib.MAX_WBITS), False
                yield from self.feed(data)
                return
            raise failed("the body's compression is corrupt") from None

    def flush(self) -> bytes:
        if self._zlib is None:
            return b""
        try:
            return self._zlib.flush()
        except zlib.error:
            raise failed("the body's compression is corrupt") from None


def _header(response: httpx.Response, name: str) -> str | None:
    value = response.headers.get(name)
    return value if value and len(value) <= _MAX_HEADER_CHARS else None


def _media_type(response: httpx.Response) -> str | None:
    value = _header(response, "content-type")
    if not value:
        return None
    kind = value.split(";", 1)[0].strip().lower()
    return kind[:200] or None


def _translate(error: httpx.HTTPError, read_timeout: float) -> RaglineError:
    """The typed failure behind an httpx error; its text names the server's part, never its content."""
    if isinstance(error, httpx.ConnectTimeout):
        return failed("the server did not accept a connection in time", retryable=True)
    if isinstance(error, httpx.ReadTimeout):
        return _timed_out(f"the server sent nothing for {read_timeout:g} s")
    if isinstance(error, httpx.ConnectError):
        cause = error.__cause__ or error.__context__
        if isinstance(cause, ssl.SSLError) or "CERTIFICATE" in str(error).upper():
            return failed(
                "the TLS handshake failed (no certificate valid for the host, or no common protocol)"
            )
        return failed("the server could not be reached (connection refused or network down)", retryable=True)
    if isinstance(error, httpx.TimeoutException):
        return failed("the server did not take the request in time", retryable=True)
    if isinstance(error, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        return failed("the connection broke off during the answer", retryable=True)
    return failed(f"the fetch failed ({type(error).__name__})", retryable=True)


class Fetcher:
    """GETs URLs under a policy and limits (see the module docstring); one per task is cheap."""

    def __init__(
        self, settings: FetchSettings, *, max_bytes: int | None = None, resolver: Resolver = resolve
    ) -> None:
        self.settings = settings
        self.policy = FetchPolicy.of(settings.allow)
        self.max_bytes = min(max_bytes, settings.max_bytes) if max_bytes else settings.max_bytes
        self.resolver = resolver

    @contextlib.contextmanager
    def open(self, url: str, validators: Validators | None = None) -> Iterator[Fetched]:
        """GET `url`, following checked redirects; the body is read inside the `with` block."""
        deadline = time.monotonic() + self.settings.timeout_s
        client = httpx.Client(
            trust_env=False,  # a proxy from the environment would resolve the name itself
            follow_redirects=False,
            limits=httpx.Limits(max_keepalive_connections=0),
        )
        try:
            response, final = self._follow(client, url, validators or Validators(), deadline)
            try:
                if response.status_code == 304:
                    yield Fetched(final, True, None, validators or Validators(), iter(()))
                else:
                    found = Validators(_header(response, "etag"), _header(response, "last-modified"))
                    body = self._body(response, deadline)
                    yield Fetched(final, False, _media_type(response), found, body)
            finally:
                response.close()
        finally:
            client.close()

    def _follow(
        self, client: httpx.Client, url: str, validators: Validators, deadline: float
    ) -> tuple[httpx.Response, str]:
        current, hops = url, 0
        while True:
            target = self._target(current, redirected=hops > 0)
            response = self._request(client, target, validators, deadline)
            status = response.status_code
            if status in REDIRECTS:
                location = response.headers.get("location")
                response.close()
                if not location:
                    raise failed("the server redirected without saying where")
                hops += 1
                if hops > self.settings.max_redirects:
                    raise failed(f"more than {self.settings.max_redirects} redirects")
                try:
                    current = str(target.url.join(location))
                except (httpx.InvalidURL, UnicodeError, ValueError):
                    raise failed("the server redirected to an invalid URL") from None
                continue
            if status == 304 and (validators.etag or validators.last_modified):
                return response, target.text
            if status in (200, 203):
                return response, target.text
            response.close()
            raise failed(
                f"the server answered HTTP {status}", retryable=status in RETRYABLE_STATUS, status=status
            )

    def _target(self, url: str, *, redirected: bool) -> Target:
        try:
            target = check_url(url)
            self.policy.check_name(target)
        except RaglineError as error:
            if not redirected:
                raise
            if error.code == ErrorCode.FETCH_REFUSED:
                raise refused(f"a redirect was refused: {error.message}") from None
            raise failed("the server redirected to an invalid URL") from None
        return target

    def _request(
        self, client: httpx.Client, target: Target, validators: Validators, deadline: float
    ) -> httpx.Response:
        """Send the GET to each checked address of the host in turn, until one connects."""
        literal = target.literal
        addresses = [literal] if literal is not None else self.resolver(target.host, target.port)
        try:
            self.policy.check_addresses(target.host, addresses)
        except RaglineError:
            log.info("fetch refused: %s resolves to %s", target.host, ", ".join(map(str, addresses)))
            raise
        headers = {
            "Host": target.url.netloc.decode("ascii"),
            "User-Agent": self.settings.user_agent,
            "Accept": "*/*",
            "Accept-Encoding": "gzip, deflate",
            **validators.headers(),
        }
        # The TLS server name (and the certificate checked against it) stays the host's.
        extensions = {"sni_hostname": target.host} if target.url.scheme == "https" and not literal else {}
        last: RaglineError | None = None
        for address in addresses:
            timeout = self._timeout(deadline)
            pinned = target.url.copy_with(host=str(address))
            request = client.build_request(
                "GET", pinned, headers=headers, extensions=extensions, timeout=timeout
            )
            try:
                return client.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as error:
                last = _translate(error, self.settings.read_timeout_s)
                if not last.retryable:
                    raise last from None
            except httpx.HTTPError as error:
                raise _translate(error, self.settings.read_timeout_s) from None
        assert last is not None  # addresses is never empty
        raise last

    def _timeout(self, deadline: float) -> httpx.Timeout:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _timed_out(f"the fetch ran past its limit of {self.settings.timeout_s:g} s")
        connect = min(self.settings.connect_timeout_s, left)
        read = min(self.settings.read_timeout_s, left)
        return httpx.Timeout(connect=connect, read=read, write=read, pool=connect)

    def _body(self, response: httpx.Response, deadline: float) -> Iterator[bytes]:
        limit = self.max_bytes
        declared = response.headers.get("content-length", "")
        too_large = PermanentError(
            f"the document exceeds the fetch limit of {limit} bytes",
            code=ErrorCode.TOO_LARGE,
            details={"limit": limit},
        )
        if declared.isdigit() and int(declared) > limit:
            raise too_large  # before a byte is read
        encoding = response.headers.get("content-encoding", "").strip().lower()
        inflater = _Inflater(encoding)
        return self._stream(response, inflater, limit, too_large, deadline)

    def _stream(
        self,
        response: httpx.Response,
        inflater: _Inflater,
        limit: int,
        too_large: RaglineError,
        deadline: float,
    ) -> Iterator[bytes]:
        total = 0
        try:
            for raw in response.iter_raw():
                for part in inflater.feed(raw):
                    total += len(part)
                    if total > limit:
                        raise too_large
                    yield part
                if time.monotonic() > deadline:
                    raise _timed_out(f"the fetch ran past its limit of {self.settings.timeout_s:g} s")
            rest = inflater.flush()
        except httpx.HTTPError as error:
            raise _translate(error, self.settings.read_timeout_s) from None
        total += len(rest)
        if total > limit:
            raise too_large
        if rest:
            yield rest
