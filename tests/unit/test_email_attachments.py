"""An e-mail's attachments are judged, guarded and parsed like uploads, never by unstructured's own way."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import pytest

from shared.config import ParseSettings
from shared.errors import ErrorCode, PermanentError
from tests.fixtures import hostile, samples
from workers.stages import parse


def _parsed(tmp_path: Path, data: bytes, limits: ParseSettings | None = None) -> dict[str, Any]:
    path = tmp_path / "mail.eml"
    path.write_bytes(data)
    parse.prepare()
    result = parse._parse(path, "mail.eml", limits or ParseSettings(), ocr=False)
    assert result["kind"] == "message/rfc822"
    return result


def _texts(result: dict[str, Any]) -> str:
    return "\n".join(e["text"] for e in result["elements"])


def _refused(tmp_path: Path, data: bytes, code: ErrorCode) -> str:
    with pytest.raises(PermanentError) as refused:
        _parsed(tmp_path, data)
    assert refused.value.code == code
    return refused.value.message


def test_allowed_attachments_are_parsed_with_the_body(tmp_path: Path) -> None:
    report = samples.docx("Quarterly", {"Revenue": "Saffron exports doubled."})
    text = _texts(
        _parsed(tmp_path, hostile.email_with({"report.docx": report, "notes.txt": b"Walrus notes.\n"}))
    )
    assert "Please find the files attached." in text
    assert "Saffron exports doubled." in text
    assert "Walrus notes." in text


def test_a_refused_type_is_left_out_with_a_note(tmp_path: Path) -> None:
    attached = {"setup.exe": hostile.windows_executable(), "photo.png": b"\x89PNG\r\n\x1a\n" + bytes(64)}
    text = _texts(_parsed(tmp_path, hostile.email_with(attached)))
    assert "Attachment setup.exe is not indexed: unsupported file type: a Windows executable." in text
    assert "Attachment photo.png is not indexed: unsupported file type: a PNG image." in text
    assert "Please find the files attached." in text


def test_a_plain_zip_archive_is_not_expanded(tmp_path: Path) -> None:
    archive = tmp_path / "bundle.zip"
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr("inner.txt", "Hidden inner text.")
    text = _texts(_parsed(tmp_path, hostile.email_with({"bundle.zip": archive.read_bytes()})))
    assert "Hidden inner text." not in text
    assert "archives are not expanded" in text


def test_a_zip_bomb_attachment_fails_the_message_unexpanded(tmp_path: Path) -> None:
    message = _refused(
        tmp_path, hostile.email_with({"report.docx": hostile.docx_bomb(1024)}), ErrorCode.TOO_LARGE
    )
    assert f"over the limit of {ParseSettings().max_archive_ratio}:1" in message


def test_a_lying_zip_attachment_fails_the_message(tmp_path: Path) -> None:
    data = hostile.email_with({"report.docx": hostile.lying_docx(64, declared_size=4096)})
    assert "declares" in _refused(tmp_path, data, ErrorCode.PARSE_ERROR)


@pytest.mark.parametrize(
    "attachment",
    [
        hostile.billion_laughs(),
        hostile.xxe(Path("/etc/hostname")),
        hostile.docx_with_dtd(Path("/etc/hostname")),
    ],
)
def test_a_dtd_attachment_fails_the_message(tmp_path: Path, attachment: bytes) -> None:
    data = hostile.email_with({"data.xml": attachment})
    assert "document type declaration" in _refused(tmp_path, data, ErrorCode.PARSE_ERROR)


def test_an_attached_message_is_parsed_like_its_parent(tmp_path: Path) -> None:
    inner = hostile.email_with({"data.xml": hostile.billion_laughs()}, body="Forwarded inner body.")
    _refused(tmp_path, hostile.email_with({"forward.eml": inner}), ErrorCode.PARSE_ERROR)
    harmless = hostile.email_with({"notes.txt": b"Inner attachment text.\n"}, body="Forwarded inner body.")
    text = _texts(_parsed(tmp_path, hostile.email_with({"forward.eml": harmless})))
    assert "Forwarded inner body." in text
    assert "Inner attachment text." in text


def test_messages_nested_past_the_depth_are_refused(tmp_path: Path) -> None:
    message = hostile.email_with({}, body="The innermost body.")
    for _ in range(parse.MAX_MESSAGE_DEPTH + 1):
        message = hostile.email_with({"forward.eml": message})
    assert "nests" in _refused(tmp_path, message, ErrorCode.PARSE_ERROR)


def test_attachments_past_the_member_limit_are_refused(tmp_path: Path) -> None:
    limits = ParseSettings(max_archive_members=10)
    data = hostile.email_with({f"note{i}.txt": b"A note.\n" for i in range(11)})
    with pytest.raises(PermanentError) as refused:
        _parsed(tmp_path, data, limits)
    assert refused.value.code == ErrorCode.TOO_LARGE
    _parsed(tmp_path, hostile.email_with({f"note{i}.txt": b"A note.\n" for i in range(10)}), limits)


def test_the_text_limit_counts_the_attachments(tmp_path: Path) -> None:
    limits = ParseSettings(max_text_chars=5000)
    data = hostile.email_with({"a.txt": b"lorem ipsum " * 300, "b.txt": b"lorem ipsum " * 300})
    with pytest.raises(PermanentError) as refused:
        _parsed(tmp_path, data, limits)
    assert refused.value.code == ErrorCode.TOO_LARGE


def test_a_mail_whose_body_is_another_text_type_keeps_its_body(tmp_path: Path) -> None:
    # git-doc's howto/*.txt are mails of Content-type: text/asciidoc; unstructured found no body.
    mail = (
        b"From: Junio C Hamano <gitster@pobox.com>\nDate: Wed, 21 Nov 2007 16:32:55 -0800\n"
        b"Subject: Maintaining Git\nContent-type: text/asciidoc\n\nHow to maintain Git\n"
        b"===================\n\nThe maintainer's life is a busy one.\n"
    )
    assert "The maintainer's life is a busy one." in _texts(_parsed(tmp_path, mail))


def _message(charset: str, body: bytes) -> bytes:
    head = (
        "From: keeper@example.org\r\nTo: crew@example.org\r\nSubject: Harbour notes\r\nMIME-Version: 1.0\r\n"
        f"Content-Type: text/plain; charset={charset}\r\nContent-Transfer-Encoding: 8bit\r\n\r\n"
    )
    return head.encode("ascii") + body


@pytest.mark.parametrize(
    ("charset", "body"),
    [
        ("unknown-8bit", "Café crème at the harbour.\r\n".encode()),  # mail archives' label
        ("unknown-8bit", "Café crème at the harbour.\r\n".encode("cp1252")),
        ("utf8mb4", "Café crème at the harbour.\r\n".encode()),
        ("x-user-defined", "Café crème at the harbour.\r\n".encode()),
        ("zlib_codec", "Café crème at the harbour.\r\n".encode()),  # a codec, of bytes not text
        ("base64", "Café crème at the harbour.\r\n".encode("cp1252")),
    ],
)
def test_a_charset_label_without_a_codec_is_read_as_a_file_would_be(
    tmp_path: Path, charset: str, body: bytes
) -> None:
    """The partitioner failed the whole message on the label (LookupError)."""
    assert "Café crème at the harbour." in _texts(_parsed(tmp_path, _message(charset, body)))


def test_a_message_is_headed_by_its_subject_and_an_attached_one_by_its_own(tmp_path: Path) -> None:
    """The document's title was the file name, or the label of the first attachment."""
    inner = (
        b"From: a@example.org\r\nSubject: =?utf-8?q?Inner_r=C3=A9sum=C3=A9?=\r\n"
        b"Content-Type: text/plain\r\n\r\n"
        b"The inner body says that the harbour closes at dusk, and that the boats wait.\r\n"
    )
    outer = hostile.email_with({"forwarded.eml": inner}).replace(
        b"Subject: Files", b"Subject: =?utf-8?b?0J7RgtGH0ZHRgiDQt9CwINC80LDQuQ==?=\r\n\tand more"
    )
    elements = _parsed(tmp_path, outer)["elements"]
    titles = [(e["text"], e["category_depth"]) for e in elements if e["type"] == "Title"]
    assert titles == [("Отчёт за май and more", 0), ("Attachment forwarded.eml", 0), ("Inner résumé", 1)]
    assert elements[0]["text"] == "Отчёт за май and more"


def test_a_message_without_a_subject_has_no_made_up_heading(tmp_path: Path) -> None:
    body = (
        b"From: keeper@example.org\r\nTo: crew@example.org\r\nDate: Mon, 1 Jan 2024 10:00:00 +0000\r\n"
        b"MIME-Version: 1.0\r\nContent-Type: text/plain\r\n\r\nOnly a body, of a few words.\r\n"
    )
    blank = body.replace(b"From:", b"Subject:  \t \r\nFrom:")
    assert _parsed(tmp_path, blank)["elements"] == _parsed(tmp_path, body)["elements"]
    assert _texts(_parsed(tmp_path, body)) == "Only a body, of a few words."


@pytest.mark.parametrize(
    "sent", ["Grüße aus Köln".encode("latin-1"), "Grüße aus Köln".encode(), "Grüße aus Köln".encode("cp1252")]
)
def test_a_subject_in_raw_8bit_bytes_is_read_as_text_is(tmp_path: Path, sent: bytes) -> None:
    """Without encoded words the parser kept the bytes undecoded and showed U+FFFD: `Gr��e aus K�ln`."""
    message = (
        b"From: keeper@example.org\r\nTo: crew@example.org\r\nSubject: " + sent + b"\r\n"
        b"MIME-Version: 1.0\r\nContent-Type: text/plain\r\n\r\nThe kiln fires at dawn, said the keeper.\r\n"
    )
    assert _parsed(tmp_path, message)["elements"][0]["text"] == "Grüße aus Köln"


@pytest.mark.parametrize(
    ("sent", "content_type", "title"),
    [
        # Raw bytes beside an encoded word: the word stayed literal.
        (b"R\xe9union =?utf-8?b?R3LDvMOfZQ==?=", b"text/plain", "Réunion Grüße"),
        # A short raw subject in the charset the message declares: it was windows-1252 mojibake.
        ("회의 안건 검토".encode("euc_kr"), b"text/plain; charset=euc-kr", "회의 안건 검토"),
        ("Счёт на оплату".encode("cp1251"), b"text/plain; charset=windows-1251", "Счёт на оплату"),
        # A charset label of no text codec is passed over, not raised.
        ("Grüße".encode("latin-1"), b"text/plain; charset=zlib_codec", "Grüße"),
        ("Grüße".encode("latin-1"), b"text/plain; charset=no-such-charset", "Grüße"),
    ],
)
def test_a_raw_subject_takes_the_messages_charset_and_its_encoded_words(
    tmp_path: Path, sent: bytes, content_type: bytes, title: str
) -> None:
    message = (
        b"From: keeper@example.org\r\nTo: crew@example.org\r\nSubject: " + sent + b"\r\n"
        b"MIME-Version: 1.0\r\nContent-Type: " + content_type + b"\r\n\r\n"
        b"The kiln fires at dawn, said the keeper.\r\n"
    )
    assert _parsed(tmp_path, message)["elements"][0]["text"] == title
