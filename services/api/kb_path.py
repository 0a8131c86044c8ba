"""The knowledge base segment of a /v1/kbs/... path must be a valid KB id as the client sent it.

The server decodes the path before routing, so `/v1/kbs/kb%2Fdocuments%2Fx` would reach the
route of document x of kb: a KB command sent with such an id would act on a document. The raw
path tells what the client meant; a KB segment that is not a KB id once decoded (an encoded `/`,
`..`, `%`) is refused before routing. Document ids, after `/documents/`, may hold encoded slashes.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from starlette.types import ASGIApp, Receive, Scope, Send

from services.core.envelope import envelope
from shared.errors import ErrorCode
from shared.models import ID_PATTERN

_KBS = "/v1/kbs/"
_KB_ID = re.compile(ID_PATTERN)


def kb_segment(scope: Scope) -> str | None:
    """The KB segment of the request's path as sent, decoded; None when the path names no KB."""
    path: str = scope["path"]
    if not path.startswith(_KBS):
        return None
    raw: bytes = scope.get("raw_path") or path.encode()
    segments = raw.split(b"?", 1)[0].decode("latin-1").split("/")
    # ["", "v1", "kbs", KB, ...]; a raw path that does not start so was normalised: use it anyway.
    if len(segments) < 4 or segments[1:3] != ["v1", "kbs"]:
        return path[len(_KBS) :].split("/", 1)[0]
    if len(segments) == 4 and segments[3] == "":
        return None  # "/v1/kbs/": the collection
    return unquote(segments[3], errors="strict")


class KbPathCheck:
    """Answers INVALID_ARGUMENT for a /v1/kbs/{kb_id}... path whose KB segment is not a KB id."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                kb_id = kb_segment(scope)
            except UnicodeDecodeError:
                kb_id = ""
            if kb_id is not None and not _KB_ID.fullmatch(kb_id):
                response = envelope(
                    ErrorCode.INVALID_ARGUMENT,
                    f"the knowledge base id in the path must match {ID_PATTERN} (no encoded '/')",
                    {"field": "kb_id"},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
