"""The connector of each source type, built from a source's stored settings: the one place that
knows which module serves which type."""

from __future__ import annotations

from shared.config import Settings
from shared.errors import ErrorCode, PermanentError
from shared.fetch.policy import FetchPolicy
from shared.sources.models import FolderSettings, GitSettings, S3Settings, Source, SourceType, WebSettings
from shared.sources.service import folder_roots
from workers.sources.connector import Connector
from workers.sources.folder import FolderConnector
from workers.sources.git import GitConnector, cache_dir
from workers.sources.s3 import S3Connector, endpoint_for
from workers.sources.web import WebConnector


def connector_for(source: Source, settings: Settings) -> Connector:
    max_bytes = settings.api.max_file_bytes
    if source.type == SourceType.FOLDER:
        roots = folder_roots(settings, source.tenant_id)
        return FolderConnector(FolderSettings.model_validate(source.settings), roots, max_bytes)
    if source.type == SourceType.S3:
        s3 = S3Settings.model_validate(source.settings)
        return S3Connector(s3, endpoint_for(s3, settings, source.tenant_id), max_bytes)
    if source.type == SourceType.WEB:
        fetch = settings.fetch
        return WebConnector(
            WebSettings.model_validate(source.settings), fetch, min(max_bytes, fetch.max_bytes)
        )
    if source.type == SourceType.GIT:
        git = GitSettings.model_validate(source.settings)
        return GitConnector(
            git,
            source.cursor,
            cache_dir(settings.state_dir, source.tenant_id, source.kb_id, source.source_id, git.url),
            folder_roots(settings, source.tenant_id),
            FetchPolicy.of(settings.fetch.allow),
            max_bytes,
            settings.sources.git_timeout_s,
        )
    raise PermanentError(f"unknown source type {source.type.value}", code=ErrorCode.INVALID_ARGUMENT)
