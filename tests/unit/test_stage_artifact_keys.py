"""Stage artifacts are keyed by the document's record, not its id alone; an artifact written
before keys named the record is still read once, for a document in the pipeline across the
upgrade, and dropped with the rest."""

from __future__ import annotations

import contextlib
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import cast

from shared import blobs
from shared.blob_dir import DirBlobStore
from shared.ingest import StageRef
from shared.models import PIPELINE, Document, Stage
from shared.registry import Versioned
from workers.context import WorkerContext
from workers.handover import UNREAD, ClaimedStage, stage_input


def _doc() -> Document:
    return Document(
        tenant_id="t", kb_id="kb", doc_id="a.txt", content_hash="h", file_size=1, content_version=2
    )


def test_two_records_of_one_id_and_version_have_their_own_keys() -> None:
    first = _doc()
    second = first.model_copy(update={"created_at": first.created_at + timedelta(microseconds=1)})
    assert blobs.artifact_key(first, 2, "parse") != blobs.artifact_key(second, 2, "parse")
    assert blobs.artifact_key(first, 2, "parse") == blobs.artifact_key(first.model_copy(), 2, "parse")


def test_a_stage_reads_an_artifact_written_before_keys_named_the_record(tmp_path: Path) -> None:
    store = DirBlobStore(tmp_path)
    doc = _doc()
    store.put_artifact(blobs.unstamped_artifact_key(doc, 2, Stage.PARSE.value), {"elements": ["before"]})
    ctx = cast(WorkerContext, SimpleNamespace(blobs=store))
    item = ClaimedStage(StageRef("t", "kb", "a.txt", 2, Stage.CHUNK), Versioned(doc, 1, 1), UNREAD)

    with contextlib.ExitStack() as files:
        assert stage_input(ctx, item, files) == {"elements": ["before"]}
    store.put_artifact(blobs.artifact_key(doc, 2, Stage.PARSE.value), {"elements": ["stamped"]})
    with contextlib.ExitStack() as files:
        assert stage_input(ctx, item, files) == {"elements": ["stamped"]}


def test_dropping_a_records_artifacts_drops_both_spellings(tmp_path: Path) -> None:
    store = DirBlobStore(tmp_path)
    doc = _doc()
    for stage in PIPELINE:
        store.put_artifact(blobs.artifact_key(doc, 1, stage.value), {})
        store.put_artifact(blobs.unstamped_artifact_key(doc, 2, stage.value), {})

    store.drop_artifacts(blobs.version_artifact_keys(doc, range(1, 3)))

    assert [path for path in (tmp_path / "artifacts").rglob("*") if path.is_file()] == []
