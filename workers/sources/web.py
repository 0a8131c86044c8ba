"""The `web` source: a site under a URL prefix, from a sitemap or crawled from a start page.

Every request goes through the SSRF-safe fetcher (shared/fetch/client.py), so a source can reach
only what the fetch policy allows, redirects included. The crawl:

- honours robots.txt (Ragline's user agent, else `*`), and its Crawl-delay up to `MAX_DELAY_S`;
- stays under the prefix (a page redirected out of it is left), follows `<a href>` links of HTML
  pages to `max_depth` and takes at most `max_pages` pages; links to images, styles and scripts
  are not followed (a sitemap names what it names);
- asks again with the page's ETag and Last-Modified: a 304 costs no body, and the page's links,
  remembered with the item, carry the crawl on;
- a page's version is its content's hash, so an answer without validators that sends the same
  bytes is still unchanged;
- a page that answers 404 or 410 is gone (its document is deleted); any other failure keeps the
  page's document as it was;
- a start page that is gone, disallowed or redirected out of the prefix fails the run: a crawl
  that found nothing would delete every document of the source (a site mid-deploy, a robots.txt
  typo).
"""

from __future__ import annotations

import hashlib
import time
import zlib
from collections import deque
from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import replace
from typing import Any
from urllib.parse import urldefrag, urljoin, urlsplit

from lxml import etree, html
from protego import Protego

from shared.config import FetchSettings
from shared.errors import ErrorCode, RaglineError
from shared.fetch.client import Fetcher, Validators
from shared.fetch.policy import MAX_URL_CHARS
from shared.models import safe_doc_id
from shared.sources.models import ItemOutcome, ItemState, WebSettings
from workers.sources.connector import Connector, Found, Gone

MAX_DELAY_S = 10.0
MAX_SITEMAPS = 50
MAX_LINKS_KEPT = 2000  # per page, remembered for a 304
GONE_STATUS = (404, 410)
_SKIPPED_SUFFIXES = (
    ".png", ".jpg", ".jpeg", ".gif", ".svg", ".ico", ".webp", ".bmp",
    ".css", ".js", ".mjs", ".map", ".woff", ".woff2", ".ttf", ".eot",
    ".mp3", ".mp4", ".webm", ".avi", ".mov", ".zip", ".gz", ".tgz", ".exe",
)  # fmt: skip
_SAFE_XML = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False, load_dtd=False)


class NotTaken(Exception):
    """A page that is no item of the source, and why."""

    def __init__(self, reason: str, code: ErrorCode) -> None:
        super().__init__(reason)
        self.reason, self.code = reason, code


def _normal(url: str) -> str:
    """A URL without its fragment: the key a page is known by."""
    return urldefrag(url)[0]


def _directory(url: str) -> str:
    parts = urlsplit(url)
    path = parts.path if parts.path.endswith("/") else parts.path.rsplit("/", 1)[0] + "/"
    return f"{parts.scheme}://{parts.netloc}{path}"


def _is_sitemap(url: str) -> bool:
    path = urlsplit(url).path.lower()
    return path.endswith((".xml", ".xml.gz"))


def page_doc_id(url: str, prefix: str) -> str:
    """The page's path under the prefix, as `ragline ingest` names a file under its folder; a
    directory's page is its index.html; a query string stays (made safe)."""
    relative = url[len(prefix) :] if url.startswith(prefix) else urlsplit(url).path.lstrip("/")
    path, _, query = relative.partition("?")
    if not path or path.endswith("/"):
        path += "index.html"
    return safe_doc_id(f"{path}?{query}" if query else path)


def links_of(body: bytes, base: str) -> list[str]:
    """The absolute http(s) targets of a page's `<a href>`s, fragments dropped, its <base> obeyed."""
    try:
        root = html.fromstring(body)
    except (etree.ParserError, ValueError):
        return []
    declared = root.xpath("//base/@href")
    base = (_joined(base, str(declared[0])) or base) if declared else base
    found: list[str] = []
    for href in root.xpath("//a/@href"):
        target = _joined(base, str(href))
        if (
            target is not None
            and target.startswith(("http://", "https://"))
            # Longer ones are never fetched; kept, a long <base> made a small page's 2,000 links
            # (remembered with the page) a record too large to store, and the run could not end.
            and len(target) <= MAX_URL_CHARS
            and target not in found
        ):
            found.append(target)
    return found


def _readable(url: str) -> str | None:
    """The URL without its fragment; None for one no URL parser reads."""
    try:
        return _normal(url)
    except ValueError:
        return None


def _joined(base: str, href: str) -> str | None:
    """The link's absolute URL without its fragment; None for one no URL parser reads ("http://[x"):
    a page's typo must not fail its site's run."""
    try:
        return _normal(urljoin(base, href.strip()))
    except ValueError:
        return None


def _gunzipped(body: bytes, max_bytes: int) -> bytes:
    """A gzipped sitemap inflated to at most `max_bytes`: a small file may inflate a thousandfold,
    and the worker's main process holds it whole."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(body, max_bytes + 1)
    except zlib.error:
        raise RaglineError("the gzipped sitemap is corrupt", code=ErrorCode.PARSE_ERROR) from None
    if len(data) > max_bytes or inflater.unconsumed_tail:
        raise RaglineError(
            f"the sitemap inflates beyond the fetch limit of {max_bytes} bytes",
            code=ErrorCode.TOO_LARGE,
            details={"limit": max_bytes},
        )
    if not inflater.eof:
        raise RaglineError("the gzipped sitemap is cut short", code=ErrorCode.PARSE_ERROR)
    return data


def sitemap_entries(body: bytes, max_bytes: int) -> tuple[list[str], list[str]]:
    """(pages, further sitemaps) a sitemap or sitemap index names; a gzipped one is inflated to at
    most `max_bytes`."""
    if body[:2] == b"\x1f\x8b":
        body = _gunzipped(body, max_bytes)
    try:
        root = etree.fromstring(body, parser=_SAFE_XML)
    except etree.XMLSyntaxError:
        raise RaglineError("the sitemap is not well-formed XML", code=ErrorCode.PARSE_ERROR) from None
    locations = [str(loc.text).strip() for loc in root.iter("{*}loc") if loc.text]
    if etree.QName(root).localname == "sitemapindex":
        return [], locations
    return locations, []


class WebConnector(Connector):
    def __init__(self, settings: WebSettings, fetch: FetchSettings, max_bytes: int) -> None:
        self.settings = settings
        self.fetcher = Fetcher(fetch, max_bytes=max_bytes)
        self.agent = fetch.user_agent
        self.prefix = settings.prefix or _directory(settings.url)
        self._robots: dict[str, Protego | None] = {}
        self._last_request = 0.0

    def scan(
        self, known: Mapping[str, ItemState], run_id: str, again: AbstractSet[str] = frozenset()
    ) -> Iterator[Found | Gone]:
        if _is_sitemap(self.settings.url):
            yield from self._from_sitemap(known, run_id)
        else:
            yield from self._crawl(known, run_id)

    def read(self, item: Found) -> bytes:
        raise RaglineError("a page is read while it is listed", code=ErrorCode.INTERNAL)

    # listing

    def _from_sitemap(self, known: Mapping[str, ItemState], run_id: str) -> Iterator[Found]:
        pages: list[str] = []
        pending: deque[str] = deque([self.settings.url])
        seen_maps: set[str] = set()
        while pending and len(seen_maps) < MAX_SITEMAPS:
            url = pending.popleft()
            if url in seen_maps:
                continue
            seen_maps.add(url)
            with self.fetcher.open(url) as fetched:
                body = b"".join(fetched.body)
            more_pages, more_maps = sitemap_entries(body, self.fetcher.max_bytes)
            pages += [p for p in map(_readable, more_pages) if p is not None and self._within(p)]
            pending.extend(m for m in more_maps if m not in seen_maps)
        taken = 0
        for url in dict.fromkeys(pages):
            if taken >= self.settings.max_pages:
                return
            try:
                found = self._page(url, known, run_id)
            except NotTaken:
                continue
            taken += 1
            yield found

    def _crawl(self, known: Mapping[str, ItemState], run_id: str) -> Iterator[Found]:
        start = _normal(self.settings.url)
        queue: deque[tuple[str, int]] = deque([(start, 0)])
        queued = {start}
        taken = 0
        while queue and taken < self.settings.max_pages:
            url, depth = queue.popleft()
            try:
                found = self._page(url, known, run_id)
            except NotTaken as skipped:
                if url == start:
                    message = f"the start page {skipped.reason}; the run changed nothing"
                    raise RaglineError(message, code=skipped.code, details={"url": url}) from None
                continue
            taken += 1
            yield found
            if depth >= self.settings.max_depth:
                continue
            for link in found.extra.get("links", []):
                if link not in queued and self._within(link) and not link.lower().endswith(_SKIPPED_SUFFIXES):
                    queued.add(link)
                    queue.append((link, depth + 1))

    def _within(self, url: str) -> bool:
        return url.startswith(self.prefix)

    # one page

    def _page(self, url: str, known: Mapping[str, ItemState], run_id: str) -> Found:
        """The page as an item; NotTaken when it is not one (robots, out of the prefix, gone)."""
        state = known.get(url)
        remembered = state.extra if state is not None else {}
        base = Found(key=url, uri=url, version=None, doc_id=page_doc_id(url, self.prefix), extra=remembered)
        if state is not None and state.run_id == run_id and state.outcome != ItemOutcome.FAILED:
            return replace(base, version=state.version, unchanged=True)  # done before a resume
        if not self._allowed(url):
            raise NotTaken("is disallowed by robots.txt", ErrorCode.FETCH_REFUSED)
        live = state is not None and state.outcome not in (ItemOutcome.DELETED, ItemOutcome.FAILED)
        validators = (
            Validators(remembered.get("etag"), remembered.get("last_modified")) if live else Validators()
        )
        self._wait_turn(url)
        try:
            with self.fetcher.open(url, validators) as fetched:
                if fetched.not_modified and state is not None:
                    return replace(base, version=state.version, unchanged=True)
                final = _normal(fetched.url)
                if not self._within(final):
                    raise NotTaken(f"redirects out of the prefix {self.prefix}", ErrorCode.FETCH_REFUSED)
                body = b"".join(fetched.body)
                kind = fetched.content_type
                found_validators = fetched.validators
        except RaglineError as error:
            if (status := error.details.get("status")) in GONE_STATUS:
                raise NotTaken(f"is gone (HTTP {status})", ErrorCode.NOT_FOUND) from None
            return replace(base, error=error)
        links = (
            links_of(body, final)[:MAX_LINKS_KEPT] if kind in ("text/html", "application/xhtml+xml") else []
        )
        extra: dict[str, Any] = {"links": [link for link in links if self._within(link)]}
        if found_validators.etag:
            extra["etag"] = found_validators.etag
        if found_validators.last_modified:
            extra["last_modified"] = found_validators.last_modified
        name = urlsplit(final).path.rsplit("/", 1)[-1] or "index.html"
        return Found(
            key=url,
            uri=final,
            version=hashlib.sha256(body).hexdigest(),
            doc_id=base.doc_id,
            filename=name,
            content=body,
            mime_type=kind,
            extra=extra,
        )

    def _allowed(self, url: str) -> bool:
        """robots.txt of the URL's origin allows Ragline's agent to fetch it (no robots.txt: yes)."""
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        if origin not in self._robots:
            self._robots[origin] = self._read_robots(origin)
        robots = self._robots[origin]
        return robots is None or bool(robots.can_fetch(url, self.agent))

    def _read_robots(self, origin: str) -> Protego | None:
        try:
            with self.fetcher.open(f"{origin}/robots.txt") as fetched:
                text = b"".join(fetched.body).decode("utf-8", "replace")
        except RaglineError as error:
            if error.details.get("status") in GONE_STATUS:
                return None  # no robots.txt: everything may be fetched
            raise  # the site is down or refuses: the run fails rather than guess
        return Protego.parse(text)

    def _wait_turn(self, url: str) -> None:
        """Keep the robots.txt Crawl-delay between requests (capped)."""
        robots = self._robots.get(f"{urlsplit(url).scheme}://{urlsplit(url).netloc}")
        delay = robots.crawl_delay(self.agent) if robots is not None else None
        if delay:
            wait = min(float(delay), MAX_DELAY_S) - (time.monotonic() - self._last_request)
            if wait > 0:
                time.sleep(wait)
        self._last_request = time.monotonic()
