"""Metadata filters over REST: a filter the request model cannot mean is a 422, and a value of
another type than the one stored is simply no match, never a failed search (503)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.e2e.helpers import Server, wait_ready

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def typed_kb(server: Server) -> str:
    kb = f"kb-{uuid.uuid4().hex[:8]}"
    with server.client("a_admin") as client:
        assert client.post(
            "/v1/kbs", json={"kb_id": kb, "name": kb, "settings": {"pii_policy": "off"}}
        ).is_success
        document = {
            "content": "The harbour pilots met at dawn.",
            "doc_id": "pilots",
            "metadata": {"year": 2020, "when": "2021-03-04", "team": "ops"},
        }
        assert client.post(f"/v1/kbs/{kb}/documents", json=document).status_code == 202
        assert wait_ready(client, kb, ["pilots"])["pilots"]["status"] == "ready"
    return kb


@pytest.mark.parametrize(
    "condition",
    [
        {"range": {"gte": 5, "lt": "2021-01-01"}},
        {"range": {"gte": True}},
        {"range": {"gte": "2021-02-30"}},
        {"range": {"gt": 1, "gte": 2}},
    ],
)
def test_a_filter_that_means_nothing_is_invalid_argument(
    server: Server, typed_kb: str, condition: dict[str, Any]
) -> None:
    with server.client("a_read") as client:
        body = {"query": "harbour pilots", "kb_ids": [typed_kb], "filters": {"metadata": {"year": condition}}}
        response = client.post("/v1/search", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["code"] == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("key", "condition", "found"),
    [
        ("year", "abc", False),  # a string against a number
        ("when", "next tuesday", False),  # not a date, against a date
        ("when", {"range": {"gte": 0}}, False),  # numbers against a date
        ("team", {"range": {"gte": "2020-01-01"}}, False),  # dates against a string
        ("year", {"range": {"gte": 2019.5, "lte": 2020}}, True),
        ("when", {"range": {"lte": "2021-03-04"}}, True),
        ("team", ["ops", 7], True),
    ],
)
def test_a_value_of_another_type_is_no_match(
    server: Server, typed_kb: str, key: str, condition: Any, found: bool
) -> None:
    with server.client("a_read") as client:
        body = {"query": "harbour pilots", "kb_ids": [typed_kb], "filters": {"metadata": {key: condition}}}
        response = client.post("/v1/search", json=body)
    assert response.status_code == 200, response.text
    assert [h["doc_id"] for h in response.json()["results"]] == (["pilots"] if found else [])
