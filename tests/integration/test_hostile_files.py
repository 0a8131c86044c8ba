"""The hostile-file corpus against the real worker: each file fails with its code, nothing else does.

Every file of tests/fixtures/hostile.py is ingested into one knowledge base beside good documents
(one of them under a file name that tries to be a path). The worker must survive (same pids), keep
its memory, never read the canary file that an XXE entity points at, and write nowhere but the
blob store.
"""

from __future__ import annotations

import json
import re
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from opensearchpy import OpenSearch

from shared.blob_dir import DirBlobStore
from shared.config import REPO_ROOT, Settings
from shared.ingest import Ingestor
from shared.models import DocStatus, Document
from shared.registry import Registry
from tests.fixtures import hostile
from tests.integration.helpers import chunks_of, new_kb, wait_terminal

pytestmark = pytest.mark.integration

# Room for a pool process with the parser, spaCy and the embedding model loaded, and the Celery
# main process beside it; a worker process that inflated a bomb itself would blow far past this.
WORKER_RSS_BOUND = int(2.5 * (1 << 30))


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    return 0


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found |= {int(child) for child in (task / "children").read_text().split()}
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def worker_pids(settings: Settings) -> set[int]:
    """The Celery main processes of the local stack (their pid files) and their pool processes."""
    mains = {int(p.read_text()) for p in settings.state_dir.glob("worker*.pid") if p.read_text().strip()}
    assert mains, f"no worker pid file in {settings.state_dir}; start the stack with `make up`"
    return mains | {child for main in mains for child in _children(main)}


@dataclass
class RssSampler:
    """Peak RSS of each worker process, and of the short-lived parse children below them."""

    pids: set[int]
    peaks: dict[int, int] = field(default_factory=dict)
    parse_child_peak: int = 0
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.is_set():
            for pid in self.pids:
                self.peaks[pid] = max(self.peaks.get(pid, 0), _rss(pid))
                for child in _children(pid) - self.pids:
                    self.parse_child_peak = max(self.parse_child_peak, _rss(child))
            self.samples += 1
            time.sleep(0.1)

    def stop(self) -> None:
        self._stop.set()


@pytest.fixture
def sampler(settings: Settings) -> Iterator[RssSampler]:
    sampler = RssSampler(worker_pids(settings))
    thread = threading.Thread(target=sampler.run, daemon=True)
    thread.start()
    yield sampler
    sampler.stop()
    thread.join()


def _indexes_mention(opensearch: OpenSearch, settings: Settings, secret: str) -> int:
    prefix = settings.opensearch.index_prefix
    opensearch.indices.refresh(index=f"{prefix}*")
    query = {"query_string": {"query": f'"{secret}"', "fields": ["*"], "lenient": True}}
    return int(opensearch.count(index=f"{prefix}*", body={"query": query})["count"])


def _files_mentioning(root: Path, secret: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and secret in p.read_bytes()]


def test_hostile_files_fail_with_their_codes_and_harm_nothing(
    registry: Registry,
    ingestor: Ingestor,
    opensearch: OpenSearch,
    settings: Settings,
    sampler: RssSampler,
    tmp_path: Path,
) -> None:
    secret = f"canary-{uuid.uuid4().hex}"
    # Indexed on purpose: shows that the searches below find what is there.
    control = f"control-{uuid.uuid4().hex}"
    good = {
        "good.txt": f"A perfectly good note about lighthouses, reference {control}.\n".encode(),
        "good.docx": hostile.docx_bomb(0),  # the bombs' own container, without the padding
    }
    canary = tmp_path / "outside-the-blob-store" / "canary.txt"
    canary.parent.mkdir()
    canary.write_text(secret + "\n")
    canary_before = canary.stat()
    corpus = hostile.corpus(canary, settings.parse)
    blob_root = settings.state_dir / "blobstore"
    folders = [path for path in blob_root.iterdir() if path.is_dir()]  # not its id's file
    bases = [settings.state_dir, blob_root, *folders, REPO_ROOT, Path.cwd()]
    names = [*corpus, *hostile.PATH_NAMES]
    targets = hostile.name_targets(names, [*bases, Path(tempfile.gettempdir())])
    paths_before = hostile.snapshot(targets)
    pids_before = sampler.pids

    kb = new_kb(registry, pii_policy="off")
    sizes = {}
    for name, item in corpus.items():
        data = item.data()
        sizes[name] = len(data)
        ingestor.submit(kb.tenant_id, kb.kb_id, data, filename=name)
    for name, data in good.items():
        ingestor.submit(kb.tenant_id, kb.kb_id, data, filename=name)
    stored: dict[str, bytes] = {}  # doc id -> the bytes submitted last under it
    for index, name in enumerate(hostile.PATH_NAMES):
        text = f"Note {index} about tide tables, filed under a strange name.\n".encode()
        stored[ingestor.submit(kb.tenant_id, kb.kb_id, text, filename=name).doc_id] = text
    doc_ids = [*corpus, *good, *stored]
    docs = wait_terminal(registry, kb, doc_ids)
    sampler.stop()

    print(f"\n{'file':28} {'bytes':>10}  outcome")
    for name in corpus:
        error = docs[name].error
        outcome = f"{error.code}: {error.message}" if error else docs[name].status.value
        print(f"{name:28} {sizes[name]:>10}  {outcome}")
    print(f"all {len(doc_ids)} documents terminal")

    _assert_codes(corpus, docs, secret)
    for doc_id in good:
        assert docs[doc_id].status == DocStatus.READY, (doc_id, docs[doc_id].error)

    # Names that try to be paths are labels: each document lives under its id, its bytes under
    # their hash.
    assert sorted(stored) == ["etc/passwd", "notes/etc/passwd", "windows/win.ini"]
    for doc_id, text in stored.items():
        doc = docs[doc_id]
        assert doc.status == DocStatus.READY, (doc_id, doc.error)
        store = ingestor.blobs
        assert isinstance(store, DirBlobStore), "this test reads the directory store's files"
        blob = store.path_of(doc.content_hash)
        assert blob.is_relative_to(blob_root / "blobs")
        assert blob.read_bytes() == text

    # The worker survived every file: same main and pool processes, memory within the bound.
    assert worker_pids(settings) == pids_before
    peak = max(sampler.peaks.values())
    print(
        f"worker RSS peak {peak / (1 << 30):.2f} GiB (bound {WORKER_RSS_BOUND / (1 << 30):.1f} GiB), "
        f"per process {[f'{v / (1 << 20):.0f} MiB' for v in sampler.peaks.values()]}, "
        f"largest parse child seen {sampler.parse_child_peak / (1 << 20):.0f} MiB, {sampler.samples} samples"
    )
    assert sampler.samples > 0
    assert peak < WORKER_RSS_BOUND

    # The XXE canary was never read, and its secret is nowhere: index, registry, blobs, logs.
    assert canary.stat().st_atime_ns == canary_before.st_atime_ns, "the canary file was read"
    assert _indexes_mention(opensearch, settings, control) > 0
    assert _indexes_mention(opensearch, settings, secret) == 0
    sources = json.dumps(chunks_of(opensearch, settings, kb)) + json.dumps(
        [d.model_dump(mode="json") for d in docs.values()]
    )
    assert control in sources
    assert secret not in sources
    assert _files_mentioning(blob_root, control.encode())
    assert _files_mentioning(blob_root, secret.encode()) == []
    assert _files_mentioning(settings.state_dir / "logs", secret.encode()) == []

    # Nothing was written where a name would lead, and the blob store holds only hashed paths.
    assert hostile.snapshot(targets) == paths_before
    assert list(canary.parent.iterdir()) == [canary]
    _assert_blob_layout(blob_root)


def _assert_codes(corpus: dict[str, hostile.Hostile], docs: dict[str, Document], secret: str) -> None:
    def outcome(doc: Document) -> tuple[str, str | None, str | None, bool | None]:
        error = doc.error
        if error is None:
            return doc.status.value, None, None, None
        return doc.status.value, error.code, error.stage, error.retryable

    assert {name: outcome(docs[name]) for name in corpus} == {
        name: ("failed", item.code, "parse", False) for name, item in corpus.items()
    }
    # Messages tell what was wrong, never what the file said.
    markers = ("lol", "Bomb", "Deep text", "lorem", "The secret is", "Leak", secret)
    messages = {name: error.message for name in corpus if (error := docs[name].error) is not None}
    assert {name: [m for m in markers if m in text] for name, text in messages.items()} == {
        name: [] for name in messages
    }


def _assert_blob_layout(root: Path) -> None:
    """Blobs at ab/cd/<sha256>, artifacts at ab/<sha256 of the key>.json: no name reaches a path."""
    for path in (root / "blobs").rglob("*"):
        if path.is_file():
            relative = path.relative_to(root / "blobs").as_posix()
            assert re.fullmatch(r"([0-9a-f]{2})/([0-9a-f]{2})/\1\2[0-9a-f]{60}", relative), path
    for path in (root / "artifacts").rglob("*"):
        if path.is_file():
            relative = path.relative_to(root / "artifacts").as_posix()
            assert re.fullmatch(r"([0-9a-f]{2})/\1[0-9a-f]{62}\.json", relative), path
