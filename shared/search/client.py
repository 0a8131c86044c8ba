"""The OpenSearch client, configured from settings, and the cluster health probe."""

from __future__ import annotations

from opensearchpy import OpenSearch

from shared.config import OpenSearchSettings


def build_client(settings: OpenSearchSettings) -> OpenSearch:
    """A client for the configured cluster; retries connection errors and timeouts a few times."""
    auth = None
    if settings.username is not None and settings.password is not None:
        auth = (settings.username, settings.password.get_secret_value())
    return OpenSearch(
        hosts=settings.urls,
        http_auth=auth,
        verify_certs=settings.verify_certs,
        timeout=settings.timeout_s,
        max_retries=3,
        retry_on_timeout=True,
        http_compress=settings.http_compress,
        # urllib3 keeps one connection per node unless told: every concurrent request past it
        # opened a connection of its own and logged "Connection pool is full" when closing it.
        pool_maxsize=settings.pool_maxsize,
    )


def cluster_status(client: OpenSearch, timeout_s: float) -> str:
    """The cluster's health colour (green, yellow, red), for readiness probes."""
    return str(client.cluster.health(request_timeout=timeout_s)["status"])
