"""Log lines: JSON or text, the bound context fields, redaction, and the API's request id."""

from __future__ import annotations

import contextvars
import io
import json
import logging
import threading
from collections.abc import Iterator

import anyio
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from services.api.request_context import HEADER, RequestContext
from shared import logs
from shared.config import RedisSettings, Settings

SECRET = "rl_live_0123456789abcdef"


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO, logging.Handler]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(logs.ContextFilter())
    handler.setFormatter(logs.JsonFormatter("test", logs.Redactor([SECRET])))
    logger = logging.getLogger("ragline.test.logs")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, stream, handler
    logger.removeHandler(handler)


def _lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_json_line_carries_the_bound_fields_and_nested_scopes_unwind(
    captured: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    logger, stream, _ = captured
    logger.info("outside")
    with logs.bound(tenant="acme", kb="docs", request_id=None):
        with logs.bound(doc_id="a.txt", stage="embed"):
            logger.warning("inner %d", 7)
        logger.info("outer")
    logger.info("after")
    outside, inner, outer, after = _lines(stream)
    assert set(outside) == {"ts", "level", "service", "logger", "msg"}
    assert str(inner.pop("ts")).endswith("+00:00")
    assert inner == {
        "level": "warning",
        "service": "test",
        "logger": "ragline.test.logs",
        "msg": "inner 7",
        "tenant": "acme",
        "kb": "docs",
        "doc_id": "a.txt",
        "stage": "embed",
    }
    assert (outer["tenant"], "doc_id" in outer, "request_id" in outer) == ("acme", False, False)
    assert "tenant" not in after


def test_a_field_added_on_another_thread_reaches_the_scope(
    captured: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    # What FastAPI does with a sync dependency: it runs in a copy of the context on a worker thread.
    logger, stream, _ = captured
    with logs.bound(request_id="r-1"):
        copy = contextvars.copy_context()
        thread = threading.Thread(target=copy.run, args=(logs.add,), kwargs={"tenant": "acme"})
        thread.start()
        thread.join()
        logger.info("after auth")
    logs.add(tenant="nowhere")  # outside any scope: nothing to attach it to
    assert logs.current() == {}
    (line,) = _lines(stream)
    assert (line["request_id"], line["tenant"]) == ("r-1", "acme")


def test_an_exception_stays_on_one_line(
    captured: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    logger, stream, _ = captured
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        logger.exception("failed")
    assert len(stream.getvalue().splitlines()) == 1
    (line,) = _lines(stream)
    assert "ValueError: boom" in str(line["exc"])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"key {SECRET} used", "key [redacted] used"),
        ("Authorization: Bearer abc.def-1", "Authorization: Bearer [redacted]"),
        ('{"x-api-key": "k-123"}', '{"x-api-key": "[redacted]"}'),
        ("http://admin:s3cret@os:9200/x", "http://admin:[redacted]@os:9200/x"),
        ("redis://:s3cret@127.0.0.1:6379/0", "redis://:[redacted]@127.0.0.1:6379/0"),
        ("PUT http://127.0.0.1:9204/idx [status:200]", "PUT http://127.0.0.1:9204/idx [status:200]"),
    ],
)
def test_secrets_and_credentials_are_redacted(text: str, expected: str) -> None:
    assert logs.Redactor([SECRET, "short"])(text) == expected


def test_the_redactor_applies_to_the_whole_line(
    captured: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    logger, stream, _ = captured
    with logs.bound(tenant=SECRET):
        logger.info("presented %s", SECRET)
    assert SECRET not in stream.getvalue()


def test_text_format_is_for_people(captured: tuple[logging.Logger, io.StringIO, logging.Handler]) -> None:
    logger, stream, handler = captured
    handler.setFormatter(logs.TextFormatter(logs.Redactor()))
    with logs.bound(kb="docs", doc_id="a.txt"):
        logger.info("ready")
    line = stream.getvalue().strip()
    assert line.endswith("INFO ragline.test.logs: ready [kb=docs doc_id=a.txt]")
    assert not line.startswith("{")


def test_configure_routes_every_logger_through_one_handler() -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        handler = logs.configure("api", "INFO", "json", [SECRET])
        assert root.handlers == [handler]
        assert isinstance(handler.formatter, logs.JsonFormatter)
        assert logging.getLogger("opensearch").getEffectiveLevel() == logging.ERROR
        # A line per MCP request is not an event: a stdio client's stderr would hold nothing else.
        assert not logging.getLogger("mcp.server.lowlevel.server").isEnabledFor(logging.INFO)
        assert logging.getLogger("mcp.server.lowlevel.server").isEnabledFor(logging.WARNING)
        assert isinstance(logs.configure("api", "DEBUG", "text").formatter, logs.TextFormatter)
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        for name in ("opensearch", "mcp.server.lowlevel.server"):
            logging.getLogger(name).setLevel(logging.NOTSET)


def _app() -> RequestContext:
    def echo(request: Request) -> PlainTextResponse:
        return PlainTextResponse(logs.current().get("request_id", ""))

    return RequestContext(Starlette(routes=[Route("/", echo)]))


def test_the_request_id_is_taken_or_made_and_echoed() -> None:
    with TestClient(_app()) as client:
        given = client.get("/", headers={HEADER: "trace-42.a"})
        made = client.get("/")
        refused = client.get("/", headers={HEADER: "no spaces allowed"})
    assert (given.headers[HEADER], given.text) == ("trace-42.a", "trace-42.a")
    assert len(made.headers[HEADER]) == 32
    assert made.text == made.headers[HEADER]
    assert refused.headers[HEADER] != "no spaces allowed"
    assert len(refused.headers[HEADER]) == 32


def _record(name: str, msg: str, error: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(error), error, None) if error is not None else None
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, None, exc_info)


def test_expected_noise_is_dropped_and_real_trouble_kept() -> None:
    noise = logs.ExpectedNoise()
    sse = "Error in standalone SSE writer"
    closed = _record("mcp.server.streamable_http", sse, anyio.ClosedResourceError())
    assert not noise.filter(closed)  # a client ended its session
    assert noise.filter(_record("mcp.server.streamable_http", sse, RuntimeError("boom")))
    skipped = (
        "Recognizer not added to registry because language is not supported by registry - EsNifRecognizer"
    )
    assert not noise.filter(_record("presidio-analyzer", skipped))
    unmapped = "Entity CARDINAL is not mapped to a Presidio entity, but keeping anyway."
    assert not noise.filter(_record("presidio-analyzer", unmapped))
    assert noise.filter(_record("presidio-analyzer", "Entity PERSON is not supported"))
    assert noise.filter(_record("ragline.test", sse, anyio.ClosedResourceError()))


@pytest.mark.parametrize(
    "url",
    [
        "redis://:hunter2-redis@10.0.0.5:6380/1",
        "redis://:hunter2%2Dredis@h/0",
        "redis://h/0?password=hunter2-redis",
    ],
)
def test_the_redis_password_is_a_secret_wherever_a_message_quotes_it(url: str) -> None:
    redact = logs.Redactor(logs.secret_values(Settings(redis=RedisSettings(url=url))))
    assert redact("AUTH hunter2-redis refused") == "AUTH [redacted] refused"
