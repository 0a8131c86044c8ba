"""A knowledge base's PII entities: an unknown name is refused at create and update, not ignored."""

from __future__ import annotations

import uuid

import pytest

from shared.models import SUPPORTED_PII_ENTITIES
from tests.e2e.helpers import Server

pytestmark = pytest.mark.e2e

_TYPOS = ["EMAIL", "CREDITCARD"]  # the names that once turned redaction off without a word


def test_unknown_entities_are_refused_at_create_and_update(server: Server) -> None:
    kb_id = f"kb-{uuid.uuid4().hex[:8]}"
    with server.client("a_admin") as client:
        refused = client.post(
            "/v1/kbs", json={"kb_id": kb_id, "name": kb_id, "settings": {"pii_entities": _TYPOS}}
        )
        assert refused.status_code == 422, refused.text
        body = refused.json()
        assert body["code"] == "INVALID_ARGUMENT"
        assert body["details"]["unknown"] == sorted(_TYPOS)
        assert body["details"]["supported"] == list(SUPPORTED_PII_ENTITIES)
        assert all(name in body["message"] for name in _TYPOS)
        assert client.get(f"/v1/kbs/{kb_id}").status_code == 404

        created = client.post(
            "/v1/kbs",
            json={"kb_id": kb_id, "name": kb_id, "settings": {"pii_entities": ["EMAIL_ADDRESS"]}},
        )
        assert created.status_code == 201, created.text
        changed = client.patch(f"/v1/kbs/{kb_id}", json={"settings": {"pii_entities": ["PERSON", "EMAIL"]}})
        assert changed.status_code == 422, changed.text
        assert changed.json()["details"]["unknown"] == ["EMAIL"]
        assert client.get(f"/v1/kbs/{kb_id}").json()["settings"]["pii_entities"] == ["EMAIL_ADDRESS"]
        fixed = client.patch(f"/v1/kbs/{kb_id}", json={"settings": {"pii_entities": ["PERSON", "IBAN_CODE"]}})
        assert fixed.status_code == 200, fixed.text
        assert fixed.json()["settings"]["pii_entities"] == ["PERSON", "IBAN_CODE"]
        assert client.delete(f"/v1/kbs/{kb_id}").status_code == 204


def test_no_entities_under_redact_or_block_is_refused(server: Server) -> None:
    kb_id = f"kb-{uuid.uuid4().hex[:8]}"
    with server.client("a_admin") as client:
        for policy in ("redact", "block"):
            settings: dict[str, object] = {"pii_policy": policy, "pii_entities": []}
            refused = client.post("/v1/kbs", json={"kb_id": kb_id, "name": kb_id, "settings": settings})
            assert refused.status_code == 422, refused.text
            assert refused.json()["code"] == "INVALID_ARGUMENT"
        assert client.get(f"/v1/kbs/{kb_id}").status_code == 404
        assert client.post("/v1/kbs", json={"kb_id": kb_id, "name": kb_id}).status_code == 201
        emptied = client.patch(f"/v1/kbs/{kb_id}", json={"settings": {"pii_entities": []}})
        assert emptied.status_code == 422, emptied.text
        off = client.patch(f"/v1/kbs/{kb_id}", json={"settings": {"pii_policy": "off", "pii_entities": []}})
        assert off.status_code == 200, off.text
