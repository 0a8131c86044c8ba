"""XHTML through the real worker: generators' pages in every encoding end ready with their text,
and a file that cannot be parsed leaves its cause in the worker log.

Every page opening with `<?xml ... encoding=...?>` (asciidoc, DocBook) failed with
`PARSE_ERROR: could not parse the file (ValueError)`, and the worker log said only `ValueError`.
"""

from __future__ import annotations

import time

import pytest
from opensearchpy import OpenSearch

from shared.config import Settings
from shared.ingest import Ingestor
from shared.models import DocStatus
from shared.registry import Registry
from tests.integration.helpers import chunks_of, new_kb, wait_terminal
from tests.unit.test_markup_encodings import LATIN_WORDS, WORDS, xhtml_page

pytestmark = pytest.mark.integration

# A page as asciidoc 10 writes it (git-doc), and one as DocBook XSL writes it (debian-faq).
ASCIIDOC_PAGE = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.1//EN"\n'
    '    "http://www.w3.org/TR/xhtml11/DTD/xhtml11.dtd">\n<html xmlns="http://www.w3.org/1999/xhtml" '
    'xml:lang="en">\n<head>\n<meta http-equiv="Content-Type" content="application/xhtml+xml; '
    'charset=UTF-8" />\n<meta name="generator" content="AsciiDoc 10.2.0" />\n<title>git-bisect(1)'
    '</title>\n</head>\n<body class="manpage">\n<div id="header">\n<h1>git-bisect(1) Manual Page</h1>'
    '\n<h2>NAME</h2>\n<div class="sectionbody">\n<p>git-bisect - Use binary search to find the commit '
    "that introduced a bug — naïvely fast</p>\n</div>\n</div>\n</body>\n</html>\n"
)
DOCBOOK_PAGE = (
    '<?xml version="1.0" encoding="ISO-8859-1" standalone="no"?>\n<!DOCTYPE html PUBLIC "-//W3C//DTD '
    'XHTML 1.0 Transitional//EN" "http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">\n<html '
    'xmlns="http://www.w3.org/1999/xhtml"><head><title>Chapter 1. Definitions</title><meta name='
    '"generator" content="DocBook XSL Stylesheets Vsnapshot" /></head><body><div class="chapter">'
    '<h1 class="title">Chapter 1. Definitions and overview</h1><p>Debian est un système libre, '
    "créé par des bénévoles.</p></div></body></html>\n"
)


def _worker_log(settings: Settings) -> str:
    return "\n".join(
        path.read_text(errors="replace") for path in sorted((settings.state_dir / "logs").glob("worker.log*"))
    )


def test_xhtml_pages_end_ready_with_their_text(
    registry: Registry, ingestor: Ingestor, opensearch: OpenSearch, settings: Settings
) -> None:
    pages = {
        "git-bisect.html": (ASCIIDOC_PAGE.encode(), "binary search to find the commit"),
        "basic-defs.en.html": (DOCBOOK_PAGE.encode("latin-1"), "créé par des bénévoles"),
        "utf8.html": (xhtml_page(WORDS, declaration="UTF-8", meta=None).encode(), WORDS),
        "latin1.html": (
            xhtml_page(LATIN_WORDS, declaration="ISO-8859-1", meta=None).encode("latin-1"),
            LATIN_WORDS,
        ),
        "utf16.html": (xhtml_page(WORDS, declaration="UTF-16", meta=None).encode("utf-16"), WORDS),
        "disagreeing.html": (
            xhtml_page(LATIN_WORDS, declaration="UTF-8", meta="ISO-8859-1").encode("latin-1"),
            LATIN_WORDS,
        ),
        "no-declaration.html": (
            xhtml_page(WORDS, declaration=None, meta="windows-1252").encode("cp1252"),
            WORDS,
        ),
    }
    kb = new_kb(registry, pii_policy="off")
    for name, (data, _) in pages.items():
        ingestor.submit(kb.tenant_id, kb.kb_id, data, filename=name, doc_id=name.replace(".", "-"))
    docs = wait_terminal(registry, kb, [name.replace(".", "-") for name in pages])
    outcomes = {doc_id: (doc.status, doc.error) for doc_id, doc in docs.items()}
    assert outcomes == dict.fromkeys(docs, (DocStatus.READY, None))
    for name, (_, words) in pages.items():
        text = " ".join(
            chunk["text"] for chunk in chunks_of(opensearch, settings, kb, name.replace(".", "-"))
        )
        assert words in text, name
        assert "\ufffd" not in text, name


def test_a_parse_failure_leaves_its_cause_in_the_worker_log(
    registry: Registry, ingestor: Ingestor, settings: Settings
) -> None:
    kb = new_kb(registry, pii_policy="off")
    broken = b'<?xml version="1.0" encoding="UTF-8"?>\n<catalog><book><title>Unclosed</book></catalog>\n'
    ingestor.submit(kb.tenant_id, kb.kb_id, broken, filename="broken.xml", doc_id="broken-xml")
    doc = wait_terminal(registry, kb, ["broken-xml"])["broken-xml"]
    assert doc.status == DocStatus.FAILED
    assert doc.error is not None
    assert (doc.error.code, doc.error.message) == ("PARSE_ERROR", "could not parse the file (XMLSyntaxError)")
    # The log line is written as the document fails; the file may lag the registry a moment.
    deadline = time.monotonic() + 30
    while "broken-xml" not in _worker_log(settings) and time.monotonic() < deadline:
        time.sleep(0.5)
    lines = [line for line in _worker_log(settings).splitlines() if "parsing broken-xml failed" in line]
    assert lines, "no parse failure line for broken-xml in the worker log"
    assert "lxml.etree.XMLSyntaxError: 'Opening and ending tag mismatch" in lines[-1]
    assert " (at " in lines[-1]
