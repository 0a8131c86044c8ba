"""The world's documents through the real worker: Debian's documentation, by a dozen generators.

The corpus (tests/corpus/) is fetched from Debian at test time into the state dir. Every file of
each package is a candidate, whatever its type; a run takes RAGLINE_TEST_CORPUS_PER_PACKAGE files
of each (default 8, spread over the file types; `all` for the full corpus). Each must end `ready`,
or `failed` with UNSUPPORTED_MEDIA_TYPE for a type Ragline does not take (EMPTY_DOCUMENT for a file
without text, PARSE_ERROR for the few known to be malformed); any other outcome fails the test
with the file, its code and message.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path

import pytest

from shared.config import Settings
from shared.errors import ErrorCode, RaglineError
from shared.ingest import Ingestor
from shared.models import DocStatus, Document
from shared.registry import Registry
from tests.corpus import build
from tests.corpus.packages import MALFORMED, PACKAGES
from tests.integration.helpers import new_kb, wait_terminal

pytestmark = pytest.mark.integration

# Suffixes of the types Ragline takes: an UNSUPPORTED answer for one of these is not honest.
TAKEN_SUFFIXES = frozenset(
    {".html", ".htm", ".xhtml", ".xml", ".txt", ".md", ".markdown", ".pdf", ".json", ".csv"}
    | {".eml", ".docx", ".pptx", ".xlsx"}
)
# Reading the files from a dozen generators takes the worker a while; each document gets this
# much on top of a base, so a full run has room as well as the sample.
WAIT_BASE_S = 600.0
WAIT_PER_DOCUMENT_S = 6.0
_PICKED = build.per_package()
_EXPECTED_DOCUMENTS = len(PACKAGES) * (_PICKED if _PICKED is not None else 250)


def _submit(ingestor: Ingestor, tenant: str, kb: str, data: bytes, name: str, doc_id: str) -> None:
    """Submit, waiting out RATE_LIMITED as a client would (a full run passes the backlog bound)."""
    deadline = time.monotonic() + 3600
    while True:
        try:
            ingestor.submit(tenant, kb, data, filename=name, doc_id=doc_id)
            return
        except RaglineError as error:
            if error.code != ErrorCode.RATE_LIMITED or time.monotonic() > deadline:
                raise
            time.sleep(float(error.details.get("retry_after", 5)))


def _wrong(item: build.CorpusFile, doc: Document) -> str | None:
    """Why the document's outcome is not acceptable; None when it is."""
    if doc.status == DocStatus.READY:
        return None
    error = doc.error
    if error is None:
        return f"{doc.status.value} without an error"
    if error.code == ErrorCode.UNSUPPORTED_MEDIA_TYPE.value and item.kind not in TAKEN_SUFFIXES:
        return None
    if error.code == ErrorCode.PARSE_ERROR.value and (item.package, item.relative) in MALFORMED:
        return None
    if error.code == ErrorCode.EMPTY_DOCUMENT.value and _has_no_text(item.path.read_bytes()):
        return None
    return f"{error.code}: {error.message}"


def _has_no_text(data: bytes) -> bool:
    """Nothing but white space, or markup with no text outside its tags (an image map, an XML
    file of empty elements)."""
    if not data.strip():
        return True
    if data.lstrip()[:1] != b"<":
        return False
    from lxml import etree, html

    try:  # XML first: the HTML parser reads an internal DTD subset as text
        xml_root = etree.fromstring(data, etree.XMLParser(resolve_entities=False, no_network=True))
        return not "".join(xml_root.itertext()).strip()
    except etree.XMLSyntaxError:
        pass
    try:
        root = html.fromstring(data)
    except (etree.ParserError, ValueError):
        return False
    etree.strip_elements(root, "script", "style", with_tail=False)
    return not root.text_content().strip()


def _outcome(doc: Document) -> str:
    return "ready" if doc.status == DocStatus.READY else (doc.error.code if doc.error else doc.status.value)


@pytest.mark.timeout(WAIT_BASE_S * 2 + WAIT_PER_DOCUMENT_S * _EXPECTED_DOCUMENTS)
def test_debian_documentation_ends_ready_or_honestly_unsupported(
    registry: Registry, ingestor: Ingestor, settings: Settings
) -> None:
    corpus = build.ensure(settings.state_dir / "corpus")
    assert len(corpus) >= 12
    picked = {name: build.sample(files, _PICKED) for name, files in corpus.items()}
    kb = new_kb(registry, pii_policy="off")
    by_id: dict[str, build.CorpusFile] = {}
    for name, files in picked.items():
        for index, item in enumerate(files):
            doc_id = f"{name}-{index:04d}"
            by_id[doc_id] = item
            _submit(
                ingestor, kb.tenant_id, kb.kb_id, item.path.read_bytes(), Path(item.relative).name, doc_id
            )
    docs = wait_terminal(registry, kb, list(by_id), timeout_s=WAIT_BASE_S + WAIT_PER_DOCUMENT_S * len(by_id))

    table: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for doc_id, item in by_id.items():
        table[item.package][_outcome(docs[doc_id])] += 1
    print(f"\n{'package':26} {'files':>5} {'ready':>5}  failed by code")
    for name, files in picked.items():
        outcomes = table[name]
        failed = {code: n for code, n in sorted(outcomes.items()) if code != "ready"}
        print(f"{name:26} {len(files):5} {outcomes['ready']:5}  {failed or '-'}")

    wrong = {
        f"{item.package}: {item.relative}": why
        for doc_id, item in by_id.items()
        if (why := _wrong(item, docs[doc_id])) is not None
    }
    assert wrong == {}
    ready_kinds = {item.kind for doc_id, item in by_id.items() if docs[doc_id].status == DocStatus.READY}
    assert {".html", ".txt", ".pdf", ".md"} <= ready_kinds, ready_kinds
