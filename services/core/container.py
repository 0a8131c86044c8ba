"""The fronts' per-process container: the services every process has (shared/wiring.py) and the
authenticator of HTTP callers, built once when a front starts."""

from __future__ import annotations

from dataclasses import dataclass

from services.core import buffer_budget
from services.core.auth import KeyRing
from services.core.identity import Authenticator
from shared.config import Settings
from shared.search.requests import SearchRequest, SearchResponse
from shared.wiring import Services, build_services


@dataclass(frozen=True)
class AppState(Services):
    auth: Authenticator | None  # None for stdio MCP, whose identity comes from configuration

    def search(self, tenant_id: str, request: SearchRequest) -> SearchResponse:
        """A search of the caller's KBs, as both fronts run it (in one worker thread: each hop
        from the event loop to a thread and back waits for a core under load)."""
        kb_ids = self.catalog.readable_kb_ids(tenant_id, request.kb_ids)
        return self.searcher.search(tenant_id, kb_ids, request)


def build_state(settings: Settings, *, http: bool = True) -> AppState:
    """Check the configuration (HTTP auth fails closed), then wire the services; OpenSearch may
    come up later."""
    auth = Authenticator(KeyRing(settings.auth, settings.tenant), settings.auth.oauth) if http else None
    buffer_budget.configure(settings.api.max_buffered_bytes)
    services = build_services(settings)
    return AppState(**{name: getattr(services, name) for name in services.__dataclass_fields__}, auth=auth)
