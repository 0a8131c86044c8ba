"""Streamable HTTP answers a request with one JSON body unless the request asked for progress.

The spec lets the server pick, request by request, between one `application/json` body and an
event stream (a client must accept both). A stream is what carries messages sent before the
answer; from our tools that is only the `ingest` wait's progress, which a client asks for with
`params._meta.progressToken`. Everything else gets JSON: an SSE answer costs the server a stream
task and the client an event-stream parse, on every search. The transport that applies this
choice to each POST is `sdk_patches.PerRequestTransport`.

A tool that starts sending log messages or requests to the client (sampling, elicitation) in
the middle of a call needs those requests answered on a stream too: widen `wants_stream` then.
"""

from __future__ import annotations


def wants_stream(body: bytes, accept: str) -> bool:
    """Whether a JSON-RPC body may carry a progress token, from a client that takes a stream.

    A substring test and not a parse, as an ingest body can be megabytes of base64. It cannot
    miss a token a client sent as JSON (a key is written `"progressToken"`), and inside a string
    value the quotes are escaped (`\\"progressToken\\"`), so a false match there is impossible; a
    false match anywhere would only cost a stream. A client that accepts only JSON gets its
    answer as JSON, without the progress, instead of a 406.
    """
    return b'"progressToken"' in body and "text/event-stream" in accept
