"""Stage artifacts belong to one record of a document: after its KB was deleted and created again
and the same file uploaded anew, the new record has the same id and version as the old one, and
a stage of the old record still at work wrote its output under the key the new record's next
stage read. The new document then went on with the old text."""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta

from shared import blobs
from shared.errors import TransientError
from shared.ingest import StageRef
from shared.models import DocStatus, KnowledgeBase, Stage, utcnow
from shared.registry import Versioned
from shared.wiring import Services
from tests.integration.helpers import new_kb, orphan
from workers import runner
from workers.handover import UNREAD, ClaimedStage, hand_over, stage_input
from workers.lease import WORKER_ID
from workers.pipeline import STAGES
from workers.stages import parse
from workers.stages.base import StageResult

NAME = "notes.txt"


def _parsing(services: Services, kb: KnowledgeBase, text: str, lease_s: int = 10) -> Versioned:
    """A record claimed at parse by this test; with less than half a stage lease left (10 s), its
    chained hand-over is written (and fenced) rather than left to the next write."""
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
        lease_until=utcnow() + timedelta(seconds=lease_s),
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


def test_a_stage_that_outlived_its_record_leaves_no_artifact_behind(services: Services) -> None:
    """A chained hand-over is not written while the claim's lease is long: the chain's next write
    records it. When that write is a release for retry and conflicts, because the record went with
    its KB meanwhile, the artifacts of the chain went nowhere: raw text no one would read or remove."""
    kb = new_kb(services.registry, pii_policy="off")
    claimed = _parsing(services, kb, "Raw text of a knowledge base about to be deleted.\n", lease_s=600)
    ref = StageRef(kb.tenant_id, kb.kb_id, NAME, claimed.doc.content_version, Stage.PARSE)
    chained = hand_over(services, ref, claimed, _parsed(services, claimed), 0.1, STAGES)
    assert chained is not None
    assert services.blobs.has_artifact(_parse_output(claimed))
    services.registry.drop_doc(claimed.doc)  # its KB deleted

    runner._release(services, chained.ref, chained.claim, TransientError("try again"), utcnow())

    assert not services.blobs.has_artifact(_parse_output(claimed))
