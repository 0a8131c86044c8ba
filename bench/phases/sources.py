"""Sources: for each type, a first sync of the same 1,000 small documents, then the figure the
sources issue asks for, an unchanged re-sync's time (what it costs to find that nothing changed).

Each source lives on loopback: a folder under the local stack's folder root, a bucket of the local
S3 server, a site served by a thread of this process (a sitemap of the pages), a git repository
on disk. The worker is restarted with the fetch policy allowing 127.0.0.1 for the phase, and the
sources are added through the service layer with the same policy (the API keeps the deployment's).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from bench.baselines import restart_worker
from bench.session import Bench
from shared.config import Settings
from shared.s3 import S3Endpoint, make_client
from shared.sources.models import SourceSpec, SyncRun
from shared.sources.service import Sources
from shared.wiring import build_services

DOCUMENTS, DOCUMENTS_QUICK = 1000, 100
LOOPBACK = '["127.0.0.1"]'
_SPEC: TypeAdapter[SourceSpec] = TypeAdapter(SourceSpec)


def _text(n: int) -> str:
    return (
        f"Note {n}. The lighthouse keeper logged wind from the {['north', 'east', 'south', 'west'][n % 4]} "
        f"at force {n % 12}, and a ship named Vessel {n} passed the point at {n % 24:02d}:00."
    )


def _documents(root: Path, count: int) -> list[str]:
    names = []
    for n in range(count):
        name = f"part-{n // 100:02d}/note-{n:04d}.html"
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"<html><head><title>Note {n}</title></head><body><p>{_text(n)}</p></body></html>")
        names.append(name)
    return names


@contextmanager
def _site(root: Path, names: list[str]) -> Iterator[str]:
    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(root)))
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    entries = "".join(f"<url><loc>{base}{name}</loc></url>" for name in names)
    (root / "sitemap.xml").write_text(
        f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{entries}</urlset>'
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{base}sitemap.xml"
    finally:
        server.shutdown()


def _git_repo(root: Path) -> Path:
    env = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "b@example.invalid", "GIT_COMMITTER_NAME": "bench"}
    env["GIT_COMMITTER_EMAIL"] = "b@example.invalid"
    for command in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "notes"]):
        subprocess.run(["git", *command], cwd=root, check=True, env={**env, "PATH": "/usr/bin:/bin"})
    return root


def _bucket(settings: Settings, names: list[str], root: Path) -> dict[str, str]:
    env_file = settings.state_dir / "s3" / "blobs.env"
    store = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    endpoint = S3Endpoint(
        store["RAGLINE_BLOBS__ENDPOINT_URL"],
        store["RAGLINE_BLOBS__REGION"],
        store["RAGLINE_BLOBS__ACCESS_KEY_ID"],
        store["RAGLINE_BLOBS__SECRET_ACCESS_KEY"],
        60.0,
    )
    s3 = make_client(endpoint)
    bucket = f"bench-sources-{int(time.time())}"
    s3.create_bucket(Bucket=bucket)
    for name in names:
        s3.put_object(Bucket=bucket, Key=f"notes/{name}", Body=(root / name).read_bytes())
    return {
        "bucket": bucket,
        "prefix": "notes/",
        "endpoint_url": endpoint.endpoint_url or "",
        "access_key_id": endpoint.access_key_id or "",
        "secret_access_key": endpoint.secret_access_key or "",
    }


def _wait(sources: Sources, tenant: str, kb: str, source_id: str, run: SyncRun) -> SyncRun:
    while run.status.active:
        time.sleep(0.2)
        run = sources.run(tenant, kb, source_id, run.run_id)
    return run


def _settled(bench: Bench, batch_id: str) -> None:
    """Wait until every document the run submitted is ready or failed."""
    while not bench.remote.get(f"/v1/batches/{batch_id}")["done"]:
        time.sleep(1)


def sources_figures(bench: Bench) -> None:
    settings = bench.settings
    count = DOCUMENTS_QUICK if bench.quick else DOCUMENTS
    # The phase's own folder root, given to the worker it restarts and to its own services: the
    # bench needs no folder root in its environment, and nothing else of the stack's is read.
    roots = bench.work / "sources"
    root = roots / "corpus"
    allowing = settings.model_copy(
        update={
            "fetch": settings.fetch.model_copy(update={"allow": ["127.0.0.1"]}),
            "sources": settings.sources.model_copy(update={"folder_roots": [roots]}),
        }
    )
    services = build_services(allowing)
    tenant = settings.tenant
    names = _documents(root, count)
    repo = _git_repo(Path(shutil.copytree(root, roots / "repository")))
    env = {"RAGLINE_FETCH__ALLOW": LOOPBACK, "RAGLINE_SOURCES__FOLDER_ROOTS": json.dumps([str(roots)])}
    restart_worker(settings, settings.celery.worker_concurrency, env=env)
    figures: dict[str, Any] = {"documents": count}
    try:
        with _site(root, names) as sitemap:
            specs: dict[str, dict[str, Any]] = {
                "folder": {"path": str(root), "include": ["**/*.html"]},
                "s3": _bucket(settings, names, root),
                "web": {"url": sitemap},
                "git": {"url": str(repo), "include": ["**/*.html"]},
            }
            for kind, source_settings in specs.items():
                figures[kind] = _one_type(bench, services.sources, tenant, kind, source_settings, count)
    finally:
        restart_worker(settings, settings.celery.worker_concurrency)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(repo, ignore_errors=True)
    bench.results["sources"] = figures


def _one_type(
    bench: Bench, sources: Sources, tenant: str, kind: str, source_settings: dict[str, Any], count: int
) -> dict[str, Any]:
    kb = f"bench-src-{kind}-{bench.stamp.lower()}"
    bench.remote.post("/v1/kbs", json={"kb_id": kb, "name": kb, "settings": {"pii_policy": "off"}})
    spec = _SPEC.validate_python({"type": kind, "source_id": kind, "settings": source_settings})
    sources.add(tenant, kb, spec)

    def timed() -> tuple[float, SyncRun]:
        started = time.monotonic()
        run = _wait(sources, tenant, kb, kind, sources.sync(tenant, kb, kind))
        if run.status.value != "succeeded":
            why = run.error or run.failures
            raise SystemExit(f"bench: the {kind} source's run ended {run.status.value}: {why}")
        return round(time.monotonic() - started, 2), run

    bench.say(f"sources: {kind}, first sync of {count} documents")
    first_s, first = timed()
    _settled(bench, first.run_id)
    bench.say(f"sources: {kind}, unchanged re-sync")
    again_s, again = timed()
    assert again.counts.get("unchanged") == count, again.counts
    bench.remote.delete(f"/v1/kbs/{kb}")
    return {
        "first_sync_s": first_s,
        "first_counts": {k: v for k, v in first.counts.items() if v},
        "unchanged_resync_s": again_s,
        "unchanged_resync_run_s": again.duration_s,
        "unchanged_counts": {k: v for k, v in again.counts.items() if v},
    }
