"""An upload whose record could not be written leaves no bytes behind: its blob goes, unless a
record needs it (the same content as a live document's). Before, every such failure after the
bytes were stored (the registry failing, a store whose locks cannot be taken) left them for good."""

from __future__ import annotations

import logging
import uuid
from hashlib import sha256

import pytest
from opensearchpy.exceptions import ConnectionError as OpenSearchDown

from shared import erasure
from shared.errors import OutageError
from shared.ingest import Ingestor
from shared.registry import Registry
from shared.wiring import Services
from tests.integration.helpers import new_kb

pytestmark = pytest.mark.integration


def _failing_writes(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    def down(*_: object, **__: object) -> None:
        raise OutageError("the registry is unavailable")

    monkeypatch.setattr(registry, "create_doc", down)
    monkeypatch.setattr(registry, "replace_doc", down)


def test_an_upload_that_wrote_no_record_leaves_no_bytes(
    services: Services, registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    kb = new_kb(registry, pii_policy="off")
    ingestor = Ingestor(services.settings, registry, services.blobs, services.sender, services.redis)
    content = f"Bytes of an upload that fails: {uuid.uuid4().hex}".encode()
    kept = f"Bytes a live document needs: {uuid.uuid4().hex}".encode()
    live = ingestor.submit(kb.tenant_id, kb.kb_id, kept, filename="live.txt")

    with monkeypatch.context() as patch:
        _failing_writes(registry, patch)
        with pytest.raises(OutageError):
            ingestor.submit(kb.tenant_id, kb.kb_id, content, filename="fails.txt")
        with pytest.raises(OutageError):
            ingestor.submit(kb.tenant_id, kb.kb_id, kept, filename="same-bytes.txt")

    assert not services.blobs.exists(sha256(content).hexdigest())
    doc = registry.require_doc(kb.tenant_id, kb.kb_id, live.doc_id).doc
    assert services.blobs.exists(doc.content_hash)  # a live record's bytes stay


@pytest.mark.parametrize("outage", ["blob store", "opensearch"])
def test_bytes_that_cannot_be_released_in_an_outage_are_one_log_line_without_a_traceback(
    services: Services,
    registry: Registry,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    outage: str,
) -> None:
    """The store or registry outage that failed the upload usually fails the release too, and was
    logged where it was met: a chained traceback beside it told the operator nothing more. The
    registry's search meets OpenSearch's own error, not Ragline's."""
    kb = new_kb(registry, pii_policy="off")
    ingestor = Ingestor(services.settings, registry, services.blobs, services.sender, services.redis)
    content = f"Bytes that stay: {uuid.uuid4().hex}".encode()

    def store_out(*_: object, **__: object) -> None:
        raise OutageError("the blob store cannot be written")

    def node_down(*_: object, **__: object) -> None:
        raise OpenSearchDown("N/A", "the node refused the connection", None)

    with monkeypatch.context() as patch:
        _failing_writes(registry, patch)
        if outage == "blob store":
            patch.setattr(erasure, "release_blob", store_out)
        else:
            patch.setattr(registry, "live_hashes", node_down)
        with caplog.at_level(logging.WARNING, logger="shared.ingest"), pytest.raises(OutageError):
            ingestor.submit(kb.tenant_id, kb.kb_id, content, filename="stays.txt")

    try:
        stays = [r for r in caplog.records if "of a failed upload stay" in r.getMessage()]
        assert len(stays) == 1
        assert stays[0].exc_info is None
        said = "the blob store cannot be written" if outage == "blob store" else "refused the connection"
        assert said in stays[0].getMessage()
        assert services.blobs.exists(sha256(content).hexdigest())  # stays: a retry stores it again
    finally:
        erasure.release_blob(registry, services.blobs, sha256(content).hexdigest())
