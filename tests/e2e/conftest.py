"""An API server of the project (`ragline serve`) with test keys, against the running local stack."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.helpers import MAX_FILE_BYTES, Server, start_server, stop_server


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    handle, process = start_server(
        tmp_path_factory.mktemp("api"), {"RAGLINE_API__MAX_FILE_BYTES": str(MAX_FILE_BYTES)}
    )
    yield handle
    stop_server(process)
