"""The fetcher against a real HTTP server on loopback: the policy, redirects, limits and validators.

The server is on 127.0.0.1, which the default policy refuses; most tests allow exactly that
address, so that every other loopback address (127.0.0.2, ::1, a name for them) stays refused.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from shared.config import FetchSettings
from shared.errors import ErrorCode, RaglineError
from shared.fetch.client import Fetched, Fetcher, Validators
from tests.fixtures.web_server import (
    WebServer,
    drip,
    endless,
    gzip_bomb,
    page,
    redirect,
    serving,
    stall,
    status,
)

GUIDE = b"# Guide\n\nHow the fetcher reads a page.\n"
LOCAL = ["127.0.0.1"]


@pytest.fixture(scope="module")
def web() -> Iterator[WebServer]:
    with serving() as server:
        server.routes["/guide.md"] = page(GUIDE, "text/markdown", etag='"v1"')
        yield server


def _fetch(url: str, validators: Validators | None = None, **settings: Any) -> tuple[Fetched, bytes]:
    fetcher = Fetcher(FetchSettings(**{"allow": LOCAL, **settings}))
    with fetcher.open(url, validators) as fetched:
        return fetched, b"".join(fetched.body)


def _failure(url: str, **settings: Any) -> RaglineError:
    with pytest.raises(RaglineError) as failed:
        _fetch(url, **settings)
    return failed.value


def test_the_default_policy_refuses_loopback_before_connecting(web: WebServer) -> None:
    path = "/guide.md?default"
    for url in [web.url(path), web.url(path, host="localhost"), web.url(path, host="[::ffff:127.0.0.1]")]:
        error = _failure(url, allow=[])
        assert error.code == ErrorCode.FETCH_REFUSED, url
        assert "loopback" in error.message
    assert web.asked(path) == []


def test_a_name_is_resolved_and_refused_by_what_it_resolves_to(web: WebServer) -> None:
    # "localhost" is no IP literal: only its resolution (127.0.0.1) tells it is loopback.
    error = _failure(web.url("/guide.md?name"), allow=["127.0.0.2"])
    assert error.code == ErrorCode.FETCH_REFUSED
    error = _failure(web.url("/guide.md?name", host="localhost"), allow=["127.0.0.2"])
    assert error.code == ErrorCode.FETCH_REFUSED
    assert web.asked("/guide.md?name") == []


def test_an_allowed_page_is_fetched_with_its_type_and_validators(web: WebServer) -> None:
    fetched, body = _fetch(web.url("/guide.md"))
    assert body == GUIDE
    assert (fetched.url, fetched.not_modified, fetched.content_type) == (
        web.url("/guide.md"),
        False,
        "text/markdown",
    )
    assert fetched.validators.etag == '"v1"'
    assert fetched.validators.last_modified is not None
    seen = web.requests[-1].headers
    assert seen["user-agent"].startswith("Ragline/")
    assert seen["host"] == f"127.0.0.1:{web.port}"


def test_a_host_name_keeps_its_host_header_while_the_connection_goes_to_the_checked_address(
    web: WebServer,
) -> None:
    # The URL is rewritten to the address that was checked; the server still sees the name.
    fetched, body = _fetch(web.url("/guide.md?named", host="localhost"), allow=["localhost"])
    assert body == GUIDE
    assert fetched.url == web.url("/guide.md?named", host="localhost")
    assert web.asked("/guide.md?named")[-1].headers["host"] == f"localhost:{web.port}"


def test_validators_that_still_match_bring_not_modified(web: WebServer) -> None:
    first, _ = _fetch(web.url("/guide.md"))
    again, body = _fetch(web.url("/guide.md"), first.validators)
    assert again.not_modified
    assert body == b""
    assert web.asked("/guide.md")[-1].headers["if-none-match"] == '"v1"'
    changed, body = _fetch(web.url("/guide.md"), Validators(etag='"v0"'))
    assert not changed.not_modified
    assert body == GUIDE


def test_redirects_are_followed_and_each_hop_is_checked(web: WebServer) -> None:
    web.routes["/moved"] = redirect("/guide.md", 301)
    web.routes["/moved-twice"] = redirect(web.url("/moved"), 307)
    fetched, body = _fetch(web.url("/moved-twice"))
    assert (fetched.url, body) == (web.url("/guide.md"), GUIDE)

    refused_hops = {
        "/to-other-loopback": web.url("/guide.md", host="127.0.0.2"),
        "/to-metadata": "http://169.254.169.254/latest/meta-data/",
        "/to-private": "http://10.0.0.1/",
        "/to-decimal": f"http://2130706433:{web.port}/guide.md",
        "/to-file": "file:///etc/passwd",
    }
    for path, location in refused_hops.items():
        web.routes[path] = redirect(location)
        error = _failure(web.url(path), allow=[*LOCAL, "169.254.0.0/16"])
        assert error.code == ErrorCode.FETCH_REFUSED, path
        assert error.message.startswith("a redirect was refused"), path


def test_redirect_loops_end_at_the_hop_limit(web: WebServer) -> None:
    web.routes["/loop"] = redirect("/loop")
    error = _failure(web.url("/loop"), max_redirects=3)
    assert error.code == ErrorCode.FETCH_FAILED
    assert not error.retryable
    assert len(web.asked("/loop")) == 4


def test_a_body_over_the_limit_is_refused_as_it_streams(web: WebServer) -> None:
    web.routes["/endless"] = endless()
    web.routes["/declared"] = endless(declare=50 << 20)
    web.routes["/bomb"] = gzip_bomb(8 << 20)
    for path in ["/endless", "/declared", "/bomb"]:
        error = _failure(web.url(path), max_bytes=1 << 20)
        assert error.code == ErrorCode.TOO_LARGE, path
        assert error.details == {"limit": 1 << 20}


def test_a_gzip_body_within_the_limit_is_inflated(web: WebServer) -> None:
    web.routes["/zeros"] = gzip_bomb(100_000)
    _, body = _fetch(web.url("/zeros"), max_bytes=1 << 20)
    assert body == b"\0" * 100_000


def test_a_server_that_stalls_times_out(web: WebServer) -> None:
    web.routes["/stall"] = stall()
    error = _failure(web.url("/stall"), read_timeout_s=1)
    assert error.code == ErrorCode.TIMEOUT
    assert not error.retryable


def test_a_server_that_drips_meets_the_whole_fetchs_limit(web: WebServer) -> None:
    web.routes["/drip"] = drip(0.2)
    error = _failure(web.url("/drip"), timeout_s=1, read_timeout_s=5)
    assert error.code == ErrorCode.TIMEOUT
    assert "ran past its limit" in error.message


@pytest.mark.parametrize(
    ("code", "retryable"), [(404, False), (410, False), (403, False), (503, True), (429, True)]
)
def test_error_statuses_fail_without_repeating_the_body(web: WebServer, code: int, retryable: bool) -> None:
    web.routes[f"/status/{code}"] = status(code)
    error = _failure(web.url(f"/status/{code}"))
    assert (error.code, error.retryable) == (ErrorCode.FETCH_FAILED, retryable)
    assert str(code) in error.message
    assert "server's own words" not in error.message


def test_a_target_that_is_down_is_a_retryable_failure() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    error = _failure(f"http://127.0.0.1:{port}/")
    assert (error.code, error.retryable) == (ErrorCode.FETCH_FAILED, True)


def test_a_name_that_does_not_resolve_fails() -> None:
    error = _failure("http://no-such-host.invalid/")
    assert error.code == ErrorCode.FETCH_FAILED
