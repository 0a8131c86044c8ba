"""Stage artifacts belong to one record of a document: after its KB was deleted and created again
and the same file uploaded anew, the new record has the same id and version as the old one, and
a stage of the old record still at work wrote its output under the key the new record's next
stage read. The new document then went on with the old text."""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta

from shared import blobs
from shared.ingest import StageRef
from shared.models import DocStatus, KnowledgeBase, Stage, utcnow
from shared.registry import Versioned
from shared.wiring import Services
from tests.integration.helpers import new_kb, orphan
from workers.handover import UNREAD, ClaimedStage, hand_over, stage_input
from workers.lease import WORKER_ID
from workers.pipeline import STAGES
from workers.stages import parse
from workers.stages.base import StageResult

NAME = "notes.txt"


def _parsing(services: Services, kb: KnowledgeBase, text: str) -> Versioned:
    """A record claimed at parse by this test, with less than half a stage lease left, so its
    hand-over is written (and fenced) rather than left to the next write."""
    orphan(
        services.registry,
        services.settings,
        kb,
        NAME,
        text.encode(),
        status=DocStatus.PARSING,
        stage=Stage.PARSE,
        attempts=1,
        claimed_by=WORKER_ID,
        lease_until=utcnow() + timedelta(seconds=10),
    )
    return services.registry.require_doc(kb.tenant_id, kb.kb_id, NAME)


def _parsed(services: Services, claimed: Versioned) -> StageResult:
    with services.blobs.local_file(claimed.doc.content_hash) as path:
        return parse.run(services, claimed.doc, path)


def _parse_output(claimed: Versioned) -> str:
    return blobs.artifact_key(claimed.doc, claimed.doc.content_version, "parse")


def test_an_old_records_stage_neither_overwrites_nor_feeds_the_new_record(services: Services) -> None:
    registry = services.registry
    kb = new_kb(registry, pii_policy="off")
    old = _parsing(services, kb, "The old text of the deleted knowledge base.\n")
    old_result = _parsed(services, old)
    registry.drop_doc(old.doc)  # its KB deleted; the KB created again and the same file uploaded anew
    time.sleep(0.01)
    new = _parsing(services, kb, "The new text.\n")
    assert (new.doc.doc_id, new.doc.content_version) == (old.doc.doc_id, old.doc.content_version)
    ref = StageRef(kb.tenant_id, kb.kb_id, NAME, new.doc.content_version, Stage.PARSE)

    handed = hand_over(services, ref, new, _parsed(services, new), 0.1, STAGES)
    assert handed is not None
    # The old record's parse ends after the new one's: its hand-over conflicts with the new record.
    assert hand_over(services, ref, old, old_result, 0.1, STAGES) is None

    # The new record's chunk stage, run in another task, reads its input from the blob store.
    with contextlib.ExitStack() as files:
        chunk_input = stage_input(services, ClaimedStage(handed.ref, handed.claim, UNREAD), files)
    assert "The new text." in str(chunk_input)
    assert "old text" not in str(chunk_input)
    # What the old record's stage wrote went with its conflict: no raw text outlives its record.
    assert not services.blobs.has_artifact(_parse_output(old))
    assert services.blobs.has_artifact(_parse_output(new))
