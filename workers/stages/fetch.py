"""fetch: a URL's bytes into the blob store, under the SSRF policy and limits (shared/fetch/).

The first stage of a version ingested by URL; parse then reads the bytes as it reads an upload's,
the type judged from the bytes (workers/sniff.py), the name from the URL where redirects ended
(a declared Markdown or CSV type standing in for a missing extension, as a name would).

A URL ingested again brings a new version whose record still names the bytes of the ready version
(shared/ingest.py keeps them as the baseline). Sent with the validators of those bytes, a 304,
or the same bytes fetched again, ends the version here, `ready` with outcome `unchanged`: the
chunks of the ready version stand, nothing is parsed or embedded again. Other bytes replace the
baseline's, which are released once the record no longer names them.

Failures (shared/fetch/client.py): FETCH_REFUSED, FETCH_FAILED, TOO_LARGE and TIMEOUT fail the
document; an unreachable or overloaded target is retried with the stage's backoff, as any
transient failure, and fails with RETRIES_EXHAUSTED when it does not recover.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from shared import erasure
from shared.fetch.client import Fetcher, Validators
from shared.fetch.policy import name_of
from shared.models import Document, FetchInfo, Outcome
from workers.context import WorkerContext
from workers.sniff import name_hint
from workers.stages.base import StageResult

log = logging.getLogger(__name__)


def _validators(doc: Document) -> Validators | None:
    """The validators of the bytes the record holds, when it holds the ready version's."""
    held = doc.fetch
    if not doc.content_hash or held is None or held.content_hash != doc.content_hash:
        return None
    return Validators(held.etag, held.last_modified)


def _release(ctx: WorkerContext, sha256: str) -> Callable[[], None]:
    def release() -> None:
        try:
            erasure.release_blob(ctx.registry, ctx.blobs, sha256)
        except Exception as error:  # noqa: BLE001  (left behind, the bytes are only unused space)
            log.warning("releasing the replaced bytes failed (%s)", type(error).__name__)

    return release


def _name(info: FetchInfo) -> str | None:
    return name_hint(name_of(info.final_url), info.content_type)


def _unchanged(doc: Document, info: FetchInfo) -> StageResult:
    """The version ends here: its record already describes the ready version's bytes and chunks."""
    log.info("fetch of %s/%s brought the bytes of its ready version", doc.kb_id, doc.doc_id)
    updates = {"fetch": info, "filename": _name(info), "outcome": Outcome.UNCHANGED}
    return StageResult(artifact=None, finished=True, updates=updates)


def run(ctx: WorkerContext, doc: Document, url: str) -> StageResult:
    limit = min(ctx.settings.fetch.max_bytes, ctx.settings.api.max_file_bytes)
    fetcher = Fetcher(ctx.settings.fetch, max_bytes=limit)
    baseline = doc.content_hash
    validators = _validators(doc)
    with fetcher.open(url, validators) as fetched:
        if fetched.not_modified:
            assert doc.fetch is not None  # validators came from it
            info = doc.fetch.model_copy(update={"final_url": fetched.url})
            return _unchanged(doc, info)
        blob = ctx.blobs.put(fetched.body, max_bytes=limit)
    info = FetchInfo(
        final_url=fetched.url,
        content_type=fetched.content_type,
        etag=fetched.validators.etag,
        last_modified=fetched.validators.last_modified,
        content_hash=blob.sha256,
    )
    if baseline == blob.sha256:
        return _unchanged(doc, info)
    updates = {
        "content_hash": blob.sha256,
        "file_size": blob.size,
        "mime_type": fetched.content_type,
        "filename": _name(info),
        "fetch": info,
    }
    return StageResult(
        artifact={"content_hash": blob.sha256},
        updates=updates,
        after=_release(ctx, baseline) if baseline else None,
        pin=blob.sha256,
    )
