"""Which language a document is taken to be in (enrich): its whole body speaks, in any script."""

from __future__ import annotations

from workers.stages.enrich import detect_language, language_sample

ENGLISH = "The ferry leaves the harbour at dawn and returns before the evening fog rolls in. "
GERMAN = "Die Fähre verlässt den Hafen im Morgengrauen und kehrt zurück, bevor der Abendnebel aufzieht. "
RUSSIAN = "Паром выходит из гавани на рассвете и возвращается до того, как опустится вечерний туман. "
JAPANESE = "フェリーは夜明けに港を出て、夕方の霧が立ち込める前に戻ってきます。"


def test_each_language_in_its_own_script() -> None:
    assert detect_language(ENGLISH * 5, "xx") == "en"
    assert detect_language(GERMAN * 5, "xx") == "de"
    assert detect_language(RUSSIAN * 5, "xx") == "ru"
    assert detect_language(JAPANESE * 5, "xx") == "ja"


def test_an_english_preamble_does_not_decide_a_german_document() -> None:
    licence = ENGLISH * 40  # about 3,300 characters of boilerplate up front
    body = GERMAN * 250
    assert detect_language(licence + body, "xx") == "de"


def test_too_little_text_keeps_the_knowledge_bases_language() -> None:
    assert detect_language("v1.2 - 3", "fr") == "fr"
    assert detect_language("", "fr") == "fr"


def test_the_sample_is_bounded_and_spans_the_text() -> None:
    text = "a" * 1000 + "b" * 10_000 + "c" * 1000
    sample = language_sample(text)
    assert len(sample) < 2200
    assert sample.startswith("a")
    assert sample.endswith("c")
    assert "b" in sample
    assert language_sample("short text") == "short text"


HEBREW = "המעבורת יוצאת מהנמל עם שחר וחוזרת לפני שערפל הערב יורד. "
CHINESE_TRADITIONAL = "渡輪在黎明時分離開港口，並在傍晚的霧氣降臨之前返回。"


def test_codes_are_current_iso_639_1_codes() -> None:
    assert detect_language(HEBREW * 5, "xx") == "he"  # not CLD2's old "iw"
    assert detect_language(CHINESE_TRADITIONAL * 5, "xx") == "zh"  # not "zh-Hant"


def test_bytes_the_detector_cannot_take_do_not_stop_it() -> None:
    broken = (GERMAN * 3).replace("Hafen", "Ha\ud800fen").replace("Fähre", "F\x85ähre\x00")
    assert detect_language(broken, "xx") == "de"


def test_code_in_the_text_hides_nothing_from_the_detector() -> None:
    text = "if x < 3: " + GERMAN * 2 + " y > 2"
    assert detect_language(text, "xx") == "de"  # read as HTML, all between < and > was skipped


def test_noncharacters_do_not_send_a_text_to_the_default() -> None:
    assert detect_language(GERMAN * 2 + "\ufdd0\uffff\U0010fffe", "xx") == "de"


def test_only_two_letter_language_codes_come_out() -> None:
    pig_latin = "Ellohay orldway isthay isay away entencesay initay igpay atinlay orfay ethay estay. " * 4
    code = detect_language(pig_latin, "fr")
    assert len(code) == 2
    assert code not in ("un", "xx")
