"""The `web` source through the real API and a worker of its own (loopback is refused by the default
fetch policy), against a real HTTP server on loopback: a crawl and a sitemap, a change, a deletion,
an unchanged re-sync answered by 304s, robots.txt, and a run resumed after its worker was killed;
and the SQLite manual synced from the web ending as `make demo`'s folder load does."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.corpus.build import unpacked
from tests.e2e.helpers import RAGLINE
from tests.e2e.own_stack import OwnStack
from tests.e2e.sources import ENDED, add, counts, documents, sync, wait_run

pytestmark = pytest.mark.e2e

SQLITE_PAGES_ENV = "RAGLINE_TEST_SQLITE_PAGES"  # "all" for the whole manual
SQLITE_PAGES_DEFAULT = 40


@dataclass
class Site:
    """A directory served over HTTP on loopback, with the requests it got."""

    root: Path
    port: int
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path, If-Modified-Since)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def write(self, path: str, text: str, *, later: bool = False) -> None:
        file = self.root / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text)
        if later:  # HTTP dates have whole seconds: a change within one would read as unchanged
            stamp = time.time() + 5
            os.utime(file, (stamp, stamp))


@contextmanager
def serve(root: Path) -> Iterator[Site]:
    site = Site(root=root, port=0)

    class Handler(SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            site.requests.append((self.path, self.headers.get("If-Modified-Since")))
            super().do_GET()

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(root)))
    site.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield site
    finally:
        server.shutdown()


@pytest.fixture
def stack(sources_stack: OwnStack) -> OwnStack:
    return sources_stack


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    (tmp_path / "site").mkdir()
    with serve(tmp_path / "site") as served:
        yield served


@pytest.fixture
def kb(stack: OwnStack) -> Iterator[str]:
    kb_id = f"web-{secrets.token_hex(4)}"
    with stack.server.client("a_admin") as client:
        assert client.post("/v1/kbs", json={"kb_id": kb_id, "name": kb_id}).status_code == 201
        yield kb_id
        client.delete(f"/v1/kbs/{kb_id}")


def _page(title: str, text: str, links: list[str]) -> str:
    anchors = "".join(f'<a href="{link}">{link}</a> ' for link in links)
    return (
        f"<html><head><title>{title}</title></head><body><h1>{title}</h1><p>{text}</p>{anchors}</body></html>"
    )


def test_a_crawled_site_is_followed_page_by_page(stack: OwnStack, site: Site, kb: str) -> None:
    site.write("robots.txt", "User-agent: *\nDisallow: /docs/private/\n")
    site.write(
        "docs/index.html",
        _page(
            "Home",
            "The aviary guide.",
            ["birds/owl.html", "birds/kite.html", "private/keys.html", "/elsewhere.html", "logo.png"],
        ),
    )
    site.write(
        "docs/birds/owl.html", _page("Owl", "Owls turn their heads 270 degrees.", ["../index.html#top"])
    )
    site.write("docs/birds/kite.html", _page("Kite", "Red kites scavenge over motorways.", ["heron.html"]))
    site.write("docs/birds/heron.html", _page("Heron", "Grey herons stalk fish at dawn.", []))
    site.write("docs/private/keys.html", _page("Keys", "robots.txt keeps this out.", []))
    site.write("elsewhere.html", _page("Out", "Outside the prefix.", []))
    site.write("docs/logo.png", "not an image really")
    with stack.server.client("a_admin") as client:
        add(
            client,
            kb,
            {"type": "web", "source_id": "aviary", "settings": {"url": site.url("docs/index.html")}},
        )
        first = sync(client, kb, "aviary")
        assert first["status"] == "succeeded", first
        assert counts(first) == {"created": 4}, first
        docs = documents(client, kb)
        assert set(docs) == {"index.html", "birds/owl.html", "birds/kite.html", "birds/heron.html"}
        assert all(d["status"] == "ready" for d in docs.values()), docs
        assert docs["birds/owl.html"]["source_uri"] == site.url("docs/birds/owl.html")
        assert ("/docs/private/keys.html", None) not in site.requests  # robots.txt was obeyed
        hit = client.post(
            "/v1/search", json={"query": "red kites motorways", "kb_ids": [kb], "top_k": 1}
        ).json()
        assert hit["results"][0]["source_uri"] == site.url("docs/birds/kite.html")

        # A change, and a page that vanished with the link to it.
        site.write("docs/birds/owl.html", _page("Owl", "Owls swallow voles whole.", []), later=True)
        site.write(
            "docs/birds/kite.html", _page("Kite", "Red kites scavenge over motorways.", []), later=True
        )
        (site.root / "docs/birds/heron.html").unlink()
        second = sync(client, kb, "aviary")
        assert counts(second) == {"updated": 2, "unchanged": 1, "deleted": 1}, second
        assert set(documents(client, kb)) == {"index.html", "birds/owl.html", "birds/kite.html"}

        # Unchanged: every page is asked for with If-Modified-Since; the one saved again with the
        # same bytes (a newer date, so no 304) is unchanged by its content.
        (site.root / "docs/index.html").touch()
        os.utime(site.root / "docs/index.html", (time.time() + 10, time.time() + 10))
        site.requests.clear()
        third = sync(client, kb, "aviary")
        assert counts(third) == {"unchanged": 3}, third
        pages = [(path, since) for path, since in site.requests if path.endswith(".html")]
        assert len(pages) == 3
        assert all(since is not None for _, since in pages), pages
        assert client.get(f"/v1/batches/{third['run_id']}").json()["total"] == 0  # nothing submitted

        # The start page gone (a site mid-deploy), then disallowed: a crawl that found nothing
        # would delete every document; the run fails and leaves them.
        (site.root / "docs/index.html").unlink()
        gone = sync(client, kb, "aviary")
        assert (gone["status"], gone["error"]["code"]) == ("failed", "NOT_FOUND"), gone
        site.write("docs/index.html", _page("Home", "The aviary guide.", ["birds/owl.html"]))
        site.write("robots.txt", "User-agent: *\nDisallow: /docs/index.html\n")
        refused = sync(client, kb, "aviary")
        assert (refused["status"], refused["error"]["code"]) == ("failed", "FETCH_REFUSED"), refused
        assert set(documents(client, kb)) == {"index.html", "birds/owl.html", "birds/kite.html"}
        # A maintenance page in its place, with no links: the run would delete two of three.
        site.write("robots.txt", "User-agent: *\n")
        site.write("docs/index.html", _page("Home", "Down for maintenance.", []), later=True)
        maintenance = sync(client, kb, "aviary")
        assert (maintenance["status"], maintenance["error"]["code"]) == ("failed", "CONFLICT"), maintenance
        assert set(documents(client, kb)) == {"index.html", "birds/owl.html", "birds/kite.html"}


def test_a_sitemap_names_the_pages_and_a_killed_worker_resumes(stack: OwnStack, site: Site, kb: str) -> None:
    total = 300
    entries = []
    for n in range(total):
        site.write(
            f"notes/note-{n:03d}.html", _page(f"Note {n}", f"Field note {n}: a lapwing over furrow {n}.", [])
        )
        entries.append(f"<url><loc>{site.url(f'notes/note-{n:03d}.html')}</loc></url>")
    sitemap = '<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
    site.write("notes/sitemap.xml", sitemap + "".join(entries) + "</urlset>")
    with stack.server.client("a_admin") as client:
        add(
            client,
            kb,
            {"type": "web", "source_id": "notes", "settings": {"url": site.url("notes/sitemap.xml")}},
        )
        started = client.post(f"/v1/kbs/{kb}/sources/notes/sync").json()
        deadline = time.monotonic() + 300
        while True:
            run = client.get(f"/v1/kbs/{kb}/sources/notes/runs/{started['run_id']}").json()
            assert run["status"] not in ENDED, f"ended before the kill: {run}"
            if run["listed"] >= 100:
                break
            assert time.monotonic() < deadline, run
            time.sleep(0.05)
        stack.kill_worker()
        stack.start_worker()
        run = wait_run(client, kb, "notes", started["run_id"])
        assert run["status"] == "succeeded", run
        assert run["attempts"] >= 2
        assert counts(run) == {"created": total}, run
        docs = documents(client, kb)
        assert len(docs) == total
        assert {d["content_version"] for d in docs.values()} == {1}
        site.write("notes/note-007.html", _page("Note 7", "Field note 7 was rewritten.", []), later=True)
        assert counts(sync(client, kb, "notes")) == {"updated": 1, "unchanged": total - 1}


def _sqlite_subset(target: Path) -> list[str]:
    """The SQLite manual's HTML pages (every one with RAGLINE_TEST_SQLITE_PAGES=all, else an even
    sample), copied under `target` with their relative paths."""
    manual = unpacked("sqlite3-doc")
    pages = sorted(p for p in manual.rglob("*.html") if p.is_file() and not p.is_symlink())
    root = next(p.parent for p in pages if p.name == "lang_select.html")
    pages = [p for p in pages if p.is_relative_to(root)]
    wanted = os.environ.get(SQLITE_PAGES_ENV, str(SQLITE_PAGES_DEFAULT))
    if wanted != "all":
        step = max(1, len(pages) // int(wanted))
        pages = pages[::step][: int(wanted)]
    names = []
    for page in pages:
        relative = page.relative_to(root).as_posix()
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(page, target / relative)
        names.append(relative)
    return names


def test_the_sqlite_manual_from_the_web_ends_as_the_folder_load(stack: OwnStack, tmp_path: Path) -> None:
    manual = tmp_path / "sqlite"
    names = _sqlite_subset(manual)
    entries = "".join(f"<url><loc>{{base}}{name}</loc></url>" for name in names)
    with serve(manual) as served:
        (manual / "sitemap.xml").write_text(
            '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            + entries.replace("{base}", served.url(""))
            + "</urlset>"
        )
        with stack.server.client("a_admin") as client:
            for kb in ("sqlite-folder", "sqlite-web"):
                client.delete(f"/v1/kbs/{kb}")
                assert (
                    client.post(
                        "/v1/kbs", json={"kb_id": kb, "name": kb, "settings": {"pii_policy": "off"}}
                    ).status_code
                    == 201
                )
            # make demo's load: `ragline ingest DIR --kb KB --recursive --glob '*.html'`
            loaded = subprocess.run(
                [
                    RAGLINE,
                    "ingest",
                    str(manual),
                    "--kb",
                    "sqlite-folder",
                    "--recursive",
                    "--glob",
                    "*.html",
                    "--json",
                ],
                env={
                    **os.environ,
                    "RAGLINE_SERVER": stack.server.url,
                    "RAGLINE_API_KEY": stack.server.keys["a_admin"],
                },
                capture_output=True,
                text=True,
                timeout=3600,
                check=False,
            )
            assert loaded.returncode == 0, loaded.stderr[-3000:]
            add(
                client,
                "sqlite-web",
                {"type": "web", "source_id": "manual", "settings": {"url": served.url("sitemap.xml")}},
            )
            run = sync(client, "sqlite-web", "manual")
            assert run["status"] == "succeeded", run
            assert counts(run) == {"created": len(names)}, run
            folder, web = documents(client, "sqlite-folder"), documents(client, "sqlite-web")
            assert set(web) == set(folder) == set(names)
            chunks = {d: folder[d]["chunk_count"] for d in folder}
            assert {d: web[d]["chunk_count"] for d in web} == chunks
            assert all(d["status"] == "ready" for d in web.values())
            print(
                f"the SQLite manual, {len(names)} pages: {sum(chunks.values())} chunks by folder and by web"
            )
            for kb in ("sqlite-folder", "sqlite-web"):
                client.delete(f"/v1/kbs/{kb}")
