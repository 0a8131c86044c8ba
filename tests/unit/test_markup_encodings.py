"""XHTML and XML parse in whatever encoding they declare, and their DTD guards still hold.

asciidoc, DocBook and many other generators open every page with `<?xml ... encoding=...?>`;
lxml refuses a decoded `str` that carries one, so every such page failed with PARSE_ERROR.
"""

from __future__ import annotations

import codecs
from pathlib import Path

import pytest

from shared.config import ParseSettings
from shared.errors import ErrorCode, PermanentError
from tests.fixtures import hostile, samples
from workers.sniff import FileKind, detect
from workers.stages import parse
from workers.text_encoding import decode, decode_markup

WORDS = "Grüße aus Köln: café, naïve façade, 50 €"  # € is in windows-1252, not latin-1
LATIN_WORDS = WORDS.replace(" €", "")
XHTML_DOCTYPE = (
    '<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN" '
    '"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">\n'
)


def xhtml_page(words: str, *, declaration: str | None, meta: str | None) -> str:
    head = f'<?xml version="1.0" encoding="{declaration}"?>\n' if declaration else ""
    charset = f'<meta http-equiv="Content-Type" content="text/html; charset={meta}" />' if meta else ""
    return (
        f'{head}{XHTML_DOCTYPE}<html xmlns="http://www.w3.org/1999/xhtml"><head>{charset}'
        f"<title>Greetings</title></head><body><h1>Greetings</h1><p>{words}</p></body></html>\n"
    )


def _parsed_text(tmp_path: Path, data: bytes, name: str = "page.html") -> tuple[str, list[str]]:
    path = tmp_path / name
    path.write_bytes(data)
    parse.prepare()
    result = parse._parse(path, name, ParseSettings(), ocr=False)
    return result["kind"], [e["text"] for e in result["elements"]]


@pytest.mark.parametrize(
    ("declaration", "meta", "encoding", "words"),
    [
        ("UTF-8", None, "utf-8", WORDS),
        ("utf-8", "utf-8", "utf-8", WORDS),
        ("ISO-8859-1", None, "latin-1", LATIN_WORDS),
        ("ISO-8859-1", "ISO-8859-1", "latin-1", LATIN_WORDS),
        ("windows-1252", None, "cp1252", WORDS),
        ("UTF-16", None, "utf-16", WORDS),  # Python's utf-16 writes a byte order mark
        # The declaration disagrees with the <meta>: the bytes decide.
        ("UTF-8", "ISO-8859-1", "latin-1", LATIN_WORDS),
        ("ISO-8859-1", "utf-8", "utf-8", WORDS),
        # No declaration: the <meta>, or UTF-8.
        (None, "windows-1252", "cp1252", WORDS),
        (None, "ISO-8859-1", "latin-1", LATIN_WORDS),
        (None, None, "utf-8", WORDS),
    ],
)
def test_xhtml_parses_in_every_encoding_and_declaration(
    tmp_path: Path, declaration: str | None, meta: str | None, encoding: str, words: str
) -> None:
    data = xhtml_page(words, declaration=declaration, meta=meta).encode(encoding)
    kind, texts = _parsed_text(tmp_path, data)
    assert kind == FileKind.HTML.value
    assert "Greetings" in texts
    assert words in texts


def test_utf16_without_byte_order_mark_is_read_from_its_declaration(tmp_path: Path) -> None:
    data = xhtml_page(WORDS, declaration="UTF-16", meta=None).encode("utf-16-le")
    assert not data.startswith(codecs.BOM_UTF16_LE)
    assert WORDS in _parsed_text(tmp_path, data)[1]


def test_a_utf8_byte_order_mark_before_the_declaration(tmp_path: Path) -> None:
    data = codecs.BOM_UTF8 + xhtml_page(WORDS, declaration="UTF-8", meta=None).encode()
    assert WORDS in _parsed_text(tmp_path, data)[1]


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1", "utf-16"])
def test_xml_parses_in_its_declared_encoding(tmp_path: Path, encoding: str) -> None:
    name = "UTF-16" if encoding == "utf-16" else encoding.upper()
    xml = f'<?xml version="1.0" encoding="{name}"?>\n<notes><note>{LATIN_WORDS}</note></notes>\n'
    kind, texts = _parsed_text(tmp_path, xml.encode(encoding), "notes.xml")
    assert kind == FileKind.XML.value
    assert texts == [LATIN_WORDS]


@pytest.mark.parametrize(
    "data",
    [
        hostile.billion_laughs(),
        hostile.billion_laughs()
        .decode()
        .replace('version="1.0"', 'version="1.0" encoding="UTF-16"')
        .encode("utf-16"),
        hostile.billion_laughs().replace(b'version="1.0"', b'version="1.0" encoding="ISO-8859-1"'),
        hostile.xxe(Path("/etc/hostname")).decode().encode("utf-16"),
    ],
)
def test_dtds_are_refused_in_every_encoding(tmp_path: Path, data: bytes) -> None:
    with pytest.raises(PermanentError) as refused:
        _parsed_text(tmp_path, data, "bomb.xml")
    assert refused.value.code == ErrorCode.PARSE_ERROR
    assert "document type declaration" in refused.value.message


def test_an_internal_subset_in_xhtml_is_never_expanded(tmp_path: Path) -> None:
    page = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE html [<!ENTITY a "lol"><!ENTITY b '
        '"&a;&a;&a;&a;&a;&a;&a;&a;"><!ENTITY x SYSTEM "file:///etc/hostname">]>\n'
        "<html><body><p>Laughs: &b; and &x;</p></body></html>"
    )
    texts = _parsed_text(tmp_path, page.encode())[1]
    assert "lol" not in " ".join(texts)
    assert Path("/etc/hostname").read_text().strip() not in " ".join(texts)


def test_the_declaration_is_gone_once_decoded() -> None:
    text = decode_markup(b'  <?xml version="1.0" encoding="ISO-8859-1"?>\n<a>caf\xe9</a>')
    assert text == "\n<a>café</a>"


def test_plain_text_in_windows_1252_is_not_mangled() -> None:
    assert decode("“quoted” café".encode("cp1252")) == "“quoted” café"
    assert decode("plain café".encode()) == "plain café"


_RU = (
    "Это руководство на русском языке о погоде в Москве. Завтра ожидается снег и сильный ветер, "
    "поэтому жителям советуют оставаться дома."
)
_JA = "日本語の説明書です。東京の会議は明日の午後三時から始まります。参加者は資料を事前に確認してください。"
_ZH = "这是一份中文说明书，关于北京的天气和新闻。明天将有大雪和强风，居民应尽量留在家中。"
_TW = (
    "這是一份中文說明書，關於台北的天氣和新聞。明天將有大雨和強風，"
    "居民應盡量留在家中。城市服務部門已做好準備。"
)
_KO = (
    "이것은 한국어 설명서입니다. 서울의 날씨는 맑습니다. "
    "내일은 눈이 많이 오고 바람이 강하게 불 것으로 예상됩니다."
)
_EL = (
    "Αυτό είναι ένα εγχειρίδιο στα ελληνικά για τον καιρό. Αύριο αναμένεται χιόνι και δυνατός "
    "άνεμος, γι' αυτό οι κάτοικοι καλούνται να μείνουν στα σπίτια τους."
)
# A paragraph each: on a few bytes the detector is not asked (see text_encoding._other_script).
OTHER_SCRIPTS = [
    ("shift_jis", _JA),
    ("shift_jis", "東京の会議です。"),  # short, but with bytes windows-1252 leaves undefined
    ("euc_jp", _JA),
    ("gbk", _ZH),
    ("big5", _TW),
    ("euc_kr", _KO),
    ("cp1251", _RU),
    ("koi8_r", _RU),
    ("cp1253", _EL),
]


@pytest.mark.parametrize(("encoding", "words"), OTHER_SCRIPTS)
def test_legacy_encodings_of_other_scripts_are_read_even_under_a_false_declaration(
    tmp_path: Path, encoding: str, words: str
) -> None:
    """Shift_JIS declared as UTF-8 (a template's <meta>) was read as windows-1252 or latin-1: mojibake."""
    assert decode(f"{words}\n".encode(encoding)) == f"{words}\n"
    for meta in ("utf-8", None):
        kind, texts = _parsed_text(tmp_path, xhtml_page(words, declaration=None, meta=meta).encode(encoding))
        assert kind == FileKind.HTML.value
        assert words in texts, (meta, texts)


@pytest.mark.parametrize(
    ("encoding", "words"),
    [
        ("iso2022_jp", _JA),
        ("iso2022_jp", "東京の会議です。"),
        ("iso2022_jp_ext", "ｶﾀｶﾅの半角と全角カタカナ。"),
        ("iso2022_jp_2", "서울 회의와 東京の会議。"),
        ("iso2022_kr", _KO),
    ],
)
def test_iso_2022_is_read_though_its_bytes_are_valid_utf8(tmp_path: Path, encoding: str, words: str) -> None:
    """Its 7-bit bytes pass for UTF-8, escape sequences and all: Japanese mail read as `\x1b$B...`."""
    data = f"Subject line\n{words}\nplain ASCII after it.\n".encode(encoding)
    assert decode(data) == f"Subject line\n{words}\nplain ASCII after it.\n"
    kind, texts = _parsed_text(tmp_path, f"{words}\n".encode(encoding), name="note.txt")
    assert words in texts, (kind, texts)


def test_ascii_with_a_stray_escape_stays_ascii() -> None:
    data = b"Terminal colours: \x1b[31mred\x1b[0m and an escape \x1b$Z that switches nothing.\n"
    assert decode(data) == data.decode()


def test_western_text_stays_windows_1252_whatever_the_detector_guesses() -> None:
    """charset-normalizer reads this French as windows-1257; only other scripts take its word."""
    french = "Le café est très fort, n'est-ce pas? Où est la bibliothèque? « Déjà vu » — à bientôt."
    polish = "Zażółć gęślą jaźń"  # windows-1250 bytes: as before, read as windows-1252
    assert decode(french.encode("cp1252")) == french
    # Read as mac_iceland (its `ˆ` for `ö` is a modifier letter, of no script) before the detector's
    # guess had to beat windows-1252's reading.
    finnish = (
        "Työntekijä välittömillä vaaleilla: yö, työ, pöytä, öljy, höyry, sää ja myöhään. Hän söi "
        "höyrytettyä lohta työpöydän ääressä myöhään yöllä. Työpöytä ja öljylamppu, sööttö. Šakki.\n"
    ) * 4
    assert decode(finnish.encode("cp1252")) == finnish
    assert decode(polish.encode("cp1250")) == polish.encode("cp1250").decode("cp1252")


@pytest.mark.parametrize(
    ("encoding", "comment"), [("gbk", "检查输入数据并返回错误信息"), ("cp1251", "Проверяем входные данные")]
)
def test_code_with_comments_in_another_script_is_read_in_it(encoding: str, comment: str) -> None:
    """Mostly ASCII lines diluted the detector's measure of windows-1252, which then passed."""
    code = "def handler(request, context):\n    value = compute(request.args['x'], timeout=30)\n"
    text = "".join(f"{code * 4}# {comment}\n" for _ in range(6))
    assert decode(text.encode(encoding)) == text


def test_other_scripts_are_found_past_an_ascii_head() -> None:
    head = "ascii line of a long preamble\n" * 5000
    assert decode(f"{head}{_RU}".encode("koi8_r")).endswith(_RU)


def test_a_head_cut_inside_a_character_is_still_utf8() -> None:
    data = ("x" * 10 + "é").encode()[:-1]
    assert decode(data, final=False) == "x" * 10


def test_utf32s_mark_is_utf16s_before_a_nul_when_the_rest_is_not_utf32() -> None:
    utf16 = codecs.BOM_UTF16_LE + "\x00héllo".encode("utf-16-le")  # FF FE 00 00 ...
    assert decode(utf16) == "\x00héllo"
    assert decode(codecs.BOM_UTF32_LE + "héllo".encode("utf-32-le")) == "héllo"


def test_a_byte_order_mark_decides_even_when_a_byte_after_it_is_bad() -> None:
    odd = codecs.BOM_UTF16_LE + "héllo".encode("utf-16-le") + b"x"  # a last byte of half a unit
    assert decode(odd) == "héllo\ufffd"
    assert detect(odd, "note.txt") == FileKind.TEXT
    assert decode(codecs.BOM_UTF8 + b"caf\xc3\xa9 \xff ok") == "café \ufffd ok"


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32"])
def test_wide_encodings_are_text_not_binary(encoding: str) -> None:
    text = xhtml_page(WORDS, declaration="UTF-16" if "16" in encoding else "UTF-32", meta=None)
    assert detect(text.encode(encoding), "page.html") == FileKind.HTML
    assert detect("A note in UTF-16.\n".encode("utf-16"), "note.txt") == FileKind.TEXT


def test_content_after_the_closing_html_tag_is_read(tmp_path: Path) -> None:
    # groff's grohtml closes body and html first, then writes the page.
    page = (
        b'<!DOCTYPE html PUBLIC "-//W3C//DTD HTML 4.01 Transitional//EN">\n<html><head><title>Home of'
        b' Groff</title></head>\n<body bgcolor="#FFFFFF">\n\n</body>\n</html>\n\n<p>Groff is the GNU'
        b" implementation of troff.</p>\n<hr>\n"
    )
    assert "Groff is the GNU implementation of troff." in _parsed_text(tmp_path, page)[1]


def test_asciidoc_text_opening_with_a_tag_is_text(tmp_path: Path) -> None:
    # git-doc's pull-fetch-param.txt: an asciidoc list whose first term is <refspec>.
    text = b"<repository>::\n\tThe remote repository that is the source of a fetch.\n\nendif::git-pull[]\n"
    kind, texts = _parsed_text(tmp_path, text, "pull-fetch-param.txt")
    assert kind == FileKind.TEXT.value
    assert any("The remote repository" in t for t in texts)


def test_a_long_pdf_is_read_page_by_page_within_the_parse_limits(tmp_path: Path) -> None:
    # A 261-page manual (debian-reference) ran past the parse timeout through unstructured.
    pages = [[f"Chapter {n}", f"Lanthanum magnets resist heat, page {n}."] for n in range(1, 62)]
    path = tmp_path / "manual.pdf"
    path.write_bytes(samples.text_pdf(pages))
    parse.prepare()
    elements = parse._parse(path, "manual.pdf", ParseSettings(), ocr=False)["elements"]
    assert len(pages) > parse.LONG_PDF_PAGES
    by_page = {e["page_number"]: e for e in elements}
    assert sorted(by_page) == list(range(1, 62))
    assert "Lanthanum magnets resist heat, page 42." in by_page[42]["text"]
    assert by_page[42]["page_label"] == "42"
