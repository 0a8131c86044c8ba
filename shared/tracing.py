"""Optional OpenTelemetry tracing: one trace from an upload through every stage to `ready`.

Off by default (RAGLINE_TRACING__ENABLED). The API's request spans are FastAPI's own (it traces
requests once a tracer provider is installed); the context crosses the broker in W3C
`traceparent` message headers, so the request span is the parent of the first stage and each
stage of the next. With tracing off the API's no-op tracer makes every call here nearly free, and
the SDK (the `tracing` extra) is never imported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import propagate, trace

from shared.config import ConfigError, Settings

TRACER = "ragline"
HEADERS = ("traceparent", "tracestate")  # the W3C fields that carry a trace context


def setup(settings: Settings, service: str) -> None:
    """Install the SDK's tracer provider in this process when tracing is on (after any fork)."""
    config = settings.tracing
    if not config.enabled:
        return
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SimpleSpanProcessor,
        )
    except ImportError:
        raise ConfigError(
            "RAGLINE_TRACING__ENABLED: the OpenTelemetry SDK is missing (pip install 'ragline[tracing]')"
        ) from None
    provider = TracerProvider(resource=Resource.create({"service.name": f"ragline-{service}"}))
    processor: SpanProcessor
    if config.exporter == "file":
        path = config.file or settings.state_dir / "traces.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        # One JSON span per line, appended at once by every process: whole lines, never batches
        # lost when a pool process is killed.
        out = path.open("a", buffering=1, encoding="utf-8")
        processor = SimpleSpanProcessor(
            ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")
        )
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=config.otlp_endpoint))
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER)


def annotate(**attributes: str | int) -> None:
    """Set attributes on the current span (none when tracing is off)."""
    current = trace.get_current_span()
    for name, value in attributes.items():
        current.set_attribute(name, value)


def carrier() -> dict[str, str]:
    """The current trace context as message headers (empty when there is no recording span)."""
    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers


@contextlib.contextmanager
def span(name: str, headers: Mapping[str, Any] | None, **attributes: str | int) -> Iterator[trace.Span]:
    """A span whose parent travelled in `headers` (a message's, or an announcement's)."""
    parent = propagate.extract({k: v for k, v in (headers or {}).items() if isinstance(v, str)})
    with tracer().start_as_current_span(name, context=parent, attributes=attributes) as current:
        yield current
