"""Host and Origin checks of the REST routes, with the lists and the matching of the /mcp check.

Without them a web page could drive a server that serves without keys (ALLOW_ANONYMOUS): by a
cross-site request, which browsers mark with an Origin, or through DNS rebinding, whose requests
carry the attacker's host name in Host. Clients that send no Origin (the CLI, httpx, curl) pass.
"""

from __future__ import annotations

from mcp.server.transport_security import TransportSecuritySettings
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from services.api.auth_gate import is_rest
from services.core.envelope import envelope
from shared.errors import ErrorCode


def allowed(value: str, patterns: list[str]) -> bool:
    """As the MCP SDK matches them: exactly, or `name:*` for `name` with any port."""
    return value in patterns or any(p.endswith(":*") and value.startswith(p[:-1]) for p in patterns)


class HostCheck:
    def __init__(self, app: ASGIApp, security: TransportSecuritySettings) -> None:
        self.app = app
        self.hosts = security.allowed_hosts
        self.origins = security.allowed_origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_rest(scope):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host, origin = headers.get("host"), headers.get("origin")
        if not host or not allowed(host, self.hosts):
            refusal = envelope(
                ErrorCode.FORBIDDEN,
                "this server does not answer to that Host; add the name to RAGLINE_API__ALLOWED_HOSTS",
                {"header": "Host"},
            )
        elif origin and not allowed(origin, self.origins):
            refusal = envelope(
                ErrorCode.FORBIDDEN,
                "requests from that Origin are refused; add it to RAGLINE_API__ALLOWED_ORIGINS",
                {"header": "Origin"},
            )
        else:
            await self.app(scope, receive, send)
            return
        await refusal(scope, receive, send)
