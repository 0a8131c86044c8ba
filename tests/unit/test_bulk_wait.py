"""`ragline ingest --wait`: a batch the registry does not show yet is not a finished batch."""

from __future__ import annotations

from collections import Counter
from typing import Any

from client.bulk import LoadReport, _poll
from client.http import ApiError, Remote


class _NoBatchYet(Remote):
    """The server's answer while the registry has not refreshed: the batch is not found."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9", "unused-key-0123456789")

    def get(self, path: str, **_: Any) -> Any:
        raise ApiError(404, "NOT_FOUND", f"{path} not found")


def test_new_documents_whose_batch_is_not_visible_yet_are_still_waited_for() -> None:
    report = LoadReport(batch_id="b", scanned=20, uploaded=20, outcomes=Counter(created=20))
    assert not _poll(_NoBatchYet(), report)


def test_a_run_of_unchanged_files_has_no_batch_and_is_done() -> None:
    report = LoadReport(batch_id="b", scanned=20, uploaded=20, outcomes=Counter(unchanged=20))
    assert _poll(_NoBatchYet(), report)
