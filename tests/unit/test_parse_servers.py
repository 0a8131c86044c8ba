"""Parse routing: Ragline's own kinds parse in sandboxes of the lean fork server, the rest in the full one."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from shared.config import Settings
from shared.errors import ErrorCode, PermanentError
from shared.models import Document
from workers.context import WorkerContext
from workers.fork_server import ForkServer
from workers.sandbox import run_limited
from workers.stages import parse


class _CountingServer:
    """A real fork server that also counts the parses it was sent."""

    def __init__(self, server: ForkServer) -> None:
        self.server = server
        self.calls = 0

    def run(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.server.run(*args, **kwargs)


Servers = tuple[_CountingServer, _CountingServer]  # lean, full


@pytest.fixture
def servers() -> Iterator[Servers]:
    parse.start_fork_server()
    started = parse._fork_servers.pop()
    lean, full = _CountingServer(started.lean), _CountingServer(started.full)
    parse._fork_servers.append(cast(Any, SimpleNamespace(lean=lean, full=full)))
    yield lean, full
    parse._fork_servers.clear()
    started.lean.close()
    started.full.close()


def _parsed(path: Path) -> dict[str, Any]:
    ctx = cast(WorkerContext, SimpleNamespace(settings=Settings()))
    doc = Document(
        tenant_id="t", kb_id="kb", doc_id=path.name, content_hash="-", file_size=0, filename=path.name
    )
    return dict(parse.run(ctx, doc, path).artifact)


def _in_process(path: Path) -> list[dict[str, Any]]:
    parse.prepare()  # what the full server preloads, offline models included
    elements = parse._parse(path, path.name, Settings().parse, ocr=False)["elements"]
    assert isinstance(elements, list)
    return elements


def test_text_markdown_json_and_csv_never_reach_the_full_server(servers: Servers, tmp_path: Path) -> None:
    lean, full = servers
    files = {
        "notes.txt": "INSTALLATION\n\n  Run the installer, then restart the service.\n",
        "guide.md": "# Guide\n\nInstall the *package* first.\n\n## Upgrading\n\nRead the notes.\n",
        "config.json": '{"server": {"port": 8080, "host": "localhost"}}',
        "people.csv": "name,role\nAda,engineer\nGrace,admiral\n",
    }
    for name, text in files.items():
        path = tmp_path / name
        path.write_text(text)
        assert _parsed(path)["elements"] == _in_process(path)
    assert (lean.calls, full.calls) == (4, 0)


def test_other_kinds_go_on_to_the_full_server(servers: Servers, tmp_path: Path) -> None:
    lean, full = servers
    path = tmp_path / "guide.html"
    path.write_text("<html><body><h1>Guide</h1><p>Install the <b>package</b> first.</p></body></html>")
    parsed = _parsed(path)
    assert parsed["mime_type"] == "text/html"
    assert parsed["elements"] == _in_process(path)
    assert (lean.calls, full.calls) == (1, 1)


def test_legacy_encodings_of_other_scripts_decode_inside_both_sandboxes(
    servers: Servers, tmp_path: Path
) -> None:
    """The encoding detector and the codecs it picks are loaded in the sandbox, where no new file
    may be opened: a codec module imported on first use there would fail."""
    words = (
        "日本語の説明書です。東京の会議は明日の午後三時から始まります。参加者は資料を事前に確認してください。"
    )
    files = {
        "notes.txt": f"{words}\n".encode("euc_jp"),
        "page.html": f"<html><head><meta charset='utf-8'></head><body><p>{words}</p></body></html>".encode(
            "shift_jis"
        ),
    }
    for name, data in files.items():
        path = tmp_path / name
        path.write_bytes(data)
        texts = [e["text"] for e in _parsed(path)["elements"]]
        assert words in texts, (name, texts)


def test_a_refused_file_is_refused_by_the_lean_sandbox(servers: Servers, tmp_path: Path) -> None:
    lean, full = servers
    path = tmp_path / "tool.bin"
    path.write_bytes(b"\x7fELF" + bytes(200))
    with pytest.raises(PermanentError) as refused:
        _parsed(path)
    assert refused.value.code == ErrorCode.UNSUPPORTED_MEDIA_TYPE
    assert (lean.calls, full.calls) == (1, 0)


def test_json_reads_as_sections_of_path_value_lines_and_leaves_no_garbage() -> None:
    """A resident server keeps what a reference cycle holds until a full collection: the JSON
    walk made one for every document."""
    big = "1" * 21  # past 64 bits
    text = '{"a": {"b": 1, "c": [2, {"d": "x y"}]}, "e": null, "f": " ", "g": [true, 1e3, 2.5, ' + big + "]}"
    gc.collect()
    gc.disable()
    try:
        elements = parse._json(text)
        assert [(e["type"], e["text"], e.get("category_depth")) for e in elements] == [
            ("Title", "a", 1),
            ("NarrativeText", "a › b: 1", None),
            ("NarrativeText", "a › c[0]: 2", None),
            ("Title", "a › c[1]", 2),
            ("NarrativeText", "a › c[1] › d: x y", None),
            ("NarrativeText", "g[0]: true", None),
            ("NarrativeText", "g[1]: 1000.0", None),
            ("NarrativeText", "g[2]: 2.5", None),
            ("NarrativeText", f"g[3]: {big}", None),
        ]
        del elements
        assert gc.collect() == 0
    finally:
        gc.enable()


def slow_in_both_servers(
    path: Path, filename: str | None, limits: Any, ocr: bool, lean: bool = False
) -> dict[str, Any]:
    """A file whose detection in the lean server and parse in the full one each take a while."""
    time.sleep(1.5 if lean else 1.0)
    return {"kind": "text/plain", "elements": None if lean else [{"text": "parsed", "type": "Text"}]}


def test_a_parse_has_one_time_limit_across_both_servers(
    servers: Servers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parse, "_parse", slow_in_both_servers)
    limits = Settings().parse.model_copy(update={"timeout_s": 2.0})
    path = tmp_path / "file.txt"
    path.write_text("text")
    with pytest.raises(PermanentError) as caught:
        parse._parse_isolated((path, path.name, limits, False), limits)
    assert caught.value.code == ErrorCode.TIMEOUT
    assert "longer than 2 s" in caught.value.message


_JITTED = """
from numba import njit

@njit(cache=True)
def twice(x):
    return 2 * x
"""


def call_jitted() -> int:
    import jitted_for_test  # type: ignore[import-not-found]

    return int(jitted_for_test.twice(21))


def test_a_confined_parse_compiles_numba_functions_it_may_not_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """unstructured's layout code caches numba's compiled functions beside its code, where a
    confined parse may not write: on a fresh install every PDF failed. The module is imported
    before the fork, as the full server imports unstructured, so numba chose its cache there."""
    (tmp_path / "jitted_for_test.py").write_text(_JITTED)
    monkeypatch.syspath_prepend(str(tmp_path))
    import jitted_for_test  # noqa: F401

    parse.keep_numba_caches_in_memory()
    limits: dict[str, Any] = {"timeout_s": 60.0, "memory_bytes": 1 << 30, "what": "parsing"}
    assert run_limited(call_jitted, **limits) == 42
    assert not list((tmp_path / "__pycache__").glob("*.nbi"))  # nothing was written there
