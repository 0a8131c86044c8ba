"""The pure parts of source listings: globs, a page's document id, its links, sitemaps."""

from __future__ import annotations

import gzip
import zlib

import pytest

from shared.errors import ErrorCode, RaglineError
from workers.sources.connector import selected
from workers.sources.web import links_of, page_doc_id, sitemap_entries


@pytest.mark.parametrize(
    ("path", "include", "exclude", "taken"),
    [
        ("guide/install.md", ["**/*"], [".git/**", "**/.*"], True),
        ("notes.txt", ["**/*"], [".git/**", "**/.*"], True),
        (".git/config", ["**/*"], [".git/**", "**/.*"], False),
        ("docs/.hidden/x.md", ["**/*"], [".git/**", "**/.*"], False),
        (".env", ["**/*"], [".git/**", "**/.*"], False),
        ("docs/a.md", ["**/*.md"], [], True),
        ("a.md", ["**/*.md"], [], True),
        ("docs/a.txt", ["**/*.md"], [], False),
        ("docs/a.md", ["docs/**"], ["docs/drafts/**"], True),
        ("docs/drafts/a.md", ["docs/**"], ["docs/drafts/**"], False),
    ],
)
def test_globs_take_and_leave_paths(path: str, include: list[str], exclude: list[str], taken: bool) -> None:
    assert selected(path, include, exclude) is taken


@pytest.mark.parametrize(
    ("url", "doc_id"),
    [
        ("http://h/sqlite/lang.html", "lang.html"),
        ("http://h/sqlite/c3ref/open.html", "c3ref/open.html"),
        ("http://h/sqlite/", "index.html"),
        ("http://h/sqlite/docs/", "docs/index.html"),
        ("http://h/sqlite/search?q=a b", "search-q-a-b"),
        ("http://h/elsewhere/x.html", "elsewhere/x.html"),
    ],
)
def test_a_page_is_named_by_its_path_under_the_prefix(url: str, doc_id: str) -> None:
    assert page_doc_id(url, "http://h/sqlite/") == doc_id


def test_links_are_absolute_without_fragments_and_follow_base() -> None:
    body = b"""<html><head><base href="http://h/docs/"></head><body>
        <a href="a.html#part">a</a> <a href="/top.html">top</a> <a href="a.html">again</a>
        <a href="mailto:x@example.com">mail</a> <a href="javascript:void(0)">js</a>
        <a href="https://other.example/x">out</a></body></html>"""
    assert links_of(body, "http://h/elsewhere/page.html") == [
        "http://h/docs/a.html",
        "http://h/top.html",
        "https://other.example/x",
    ]
    assert links_of(b"", "http://h/") == []


def test_sitemaps_and_sitemap_indexes_plain_or_gzipped() -> None:
    urlset = b"""<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
        <url><loc> http://h/a.html </loc><lastmod>2026-01-01</lastmod></url><url><loc>http://h/b.html</loc></url>
        </urlset>"""
    assert sitemap_entries(urlset, 1 << 20) == (["http://h/a.html", "http://h/b.html"], [])
    assert sitemap_entries(gzip.compress(urlset), 1 << 20) == (["http://h/a.html", "http://h/b.html"], [])
    index = b"""<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
        <sitemap><loc>http://h/s1.xml</loc></sitemap></sitemapindex>"""
    assert sitemap_entries(index, 1 << 20) == ([], ["http://h/s1.xml"])


def test_a_sitemap_with_entities_or_broken_xml_is_refused_unexpanded() -> None:
    bomb = b"""<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;">]>
        <urlset><url><loc>http://h/&b;</loc></url></urlset>"""
    pages, _ = sitemap_entries(bomb, 1 << 20)
    assert all("aaaaaaaaaa" not in page for page in pages)
    with pytest.raises(RaglineError, match="not well-formed"):
        sitemap_entries(b"<urlset><url>", 1 << 20)


def test_a_link_no_url_parser_reads_is_left_and_the_others_kept() -> None:
    # urljoin raises ValueError on these; uncaught, one typo on a page failed its site's every run.
    body = b"""<html><body><a href="http://[oops/">typo</a> <a href="ok.html">ok</a></body></html>"""
    assert links_of(body, "http://h/docs/") == ["http://h/docs/ok.html"]
    broken_base = b"""<html><head><base href="http://[::1"></head><body><a href="x.html">x</a></body>"""
    assert links_of(broken_base, "http://h/docs/") == ["http://h/docs/x.html"]


def test_a_gzipped_sitemap_inflates_within_the_limit_and_a_corrupt_one_is_a_parse_error() -> None:
    # A thousandfold compression bomb: inflated whole, the limit's worth of download would fill the
    # worker's memory a thousand times over.
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    bomb = packer.compress(b"\0" * (8 << 20)) + packer.flush()
    with pytest.raises(RaglineError) as too_large:
        sitemap_entries(bomb, 1 << 20)
    assert too_large.value.code == ErrorCode.TOO_LARGE
    urlset = b"<urlset><url><loc>http://h/a.html</loc></url></urlset>"
    for corrupt in (b"\x1f\x8b" + b"not gzip at all", gzip.compress(urlset)[:20]):
        with pytest.raises(RaglineError) as error:
            sitemap_entries(corrupt, 1 << 20)
        assert error.value.code == ErrorCode.PARSE_ERROR


def test_links_longer_than_a_fetchable_url_are_left() -> None:
    # 2,000 relative links under an 80 KB <base> were 160 MB of links remembered with one page: a
    # record OpenSearch refuses (413), so the run could never write its items down nor end.
    base = "http://h/docs/" + "a" * 80_000 + "/"
    anchors = "".join(f'<a href="p{i}.html">p</a>' for i in range(2000))
    page = f'<html><head><base href="{base}"></head><body>{anchors}<a href="/ok.html">ok</a></body></html>'
    assert links_of(page.encode(), "http://h/docs/") == ["http://h/ok.html"]
