"""Schemathesis fuzzing of the REST API from its own /openapi.json, against the live stack: no 500s.

Every operation gets valid (positive) and invalid (negative) requests, once with random path ids
and once aimed at a real knowledge base, document and batch, so the handlers behind the 404s are
reached too. The fuzzer has its own tenant and admin key; the bounded example count keeps the
run to minutes and the uploads tiny.
"""

from __future__ import annotations

import contextlib
import secrets
from collections import Counter
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import Case, GenerationMode

from tests.e2e.helpers import Server, extra_keys, wait_ready

pytestmark = pytest.mark.e2e

EXAMPLES = 20  # per operation, mode and path variant
AUTH_HEADERS = {"authorization", "x-api-key"}  # sent by the test, never fuzzed


def _spec(server: Server) -> dict[str, Any]:
    spec: dict[str, Any] = httpx.get(f"{server.url}/openapi.json", timeout=30).json()
    for operations in spec["paths"].values():
        for operation in operations.values():
            operation["parameters"] = [
                p
                for p in operation.get("parameters", [])
                if not (p["in"] == "header" and p["name"].lower() in AUTH_HEADERS)
            ]
    return spec


def _seed(client: httpx.Client) -> dict[str, str]:
    kb = f"fuzz-{secrets.token_hex(4)}"
    assert client.post("/v1/kbs", json={"kb_id": kb, "name": "fuzz target"}).status_code == 201
    body = {"content": "Fuzzing target: the lighthouse keeper logs the tides.", "doc_id": "target.txt"}
    uploaded = client.post(f"/v1/kbs/{kb}/documents", json=body)
    assert uploaded.status_code == 202, uploaded.text
    wait_ready(client, kb, ["target.txt"])
    # A public literal address: added without a DNS lookup; its runs fail (no route), as a fuzz target may.
    source = {"type": "web", "settings": {"url": "http://93.184.216.34/docs/"}}
    added = client.post(f"/v1/kbs/{kb}/sources", json=source)
    assert added.status_code == 201, added.text
    source_id = added.json()["source_id"]
    run = client.post(f"/v1/kbs/{kb}/sources/{source_id}/sync")
    assert run.status_code == 202, run.text
    return {
        "kb_id": kb,
        "doc_id": "target.txt",
        "batch_id": uploaded.json()["batch_id"],
        "source_id": source_id,
        "run_id": run.json()["run_id"],
    }


def test_fuzzed_requests_never_get_a_server_error(server: Server) -> None:
    key = f"test-fuzz-{secrets.token_hex(16)}"
    with extra_keys(server) as write:
        write([{"key": key, "tenant": f"fz-{secrets.token_hex(4)}", "role": "admin", "name": "fuzz"}])
        auth = {"X-Api-Key": key}
        with httpx.Client(base_url=server.url, headers=auth, timeout=60) as client:
            targets = _seed(client)
        schema = schemathesis.openapi.from_dict(_spec(server))
        operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
        # Deletions last: the fixed-id pass would otherwise delete its own target early.
        operations.sort(key=lambda op: op.method.upper() == "DELETE")
        statuses: Counter[int] = Counter()
        server_errors: list[str] = []

        def send(case: Case[Any]) -> None:
            response = case.call(base_url=server.url, headers=auth, timeout=60)
            statuses[response.status_code] += 1
            if response.status_code >= 500:
                server_errors.append(
                    f"{response.status_code} {case.as_curl_command()}\n{response.text[:300]}"
                )

        for operation in operations:
            names = {p.name for p in operation.path_parameters}
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                for fixed in ({}, {n: targets[n] for n in names}) if names else ({},):
                    strategy = operation.as_strategy(generation_mode=mode, path_parameters=fixed or None)
                    run = settings(
                        max_examples=EXAMPLES,
                        deadline=None,
                        database=None,
                        phases=[Phase.explicit, Phase.generate],
                        suppress_health_check=list(HealthCheck),
                    )(given(strategy)(send))
                    # Unsatisfiable: nothing invalid can be built (e.g. no parameters); positive covers it.
                    with contextlib.suppress(Unsatisfiable):
                        run()
    cases = sum(statuses.values())
    histogram = dict(sorted(statuses.items()))
    print(f"schemathesis: {len(operations)} operations, {cases} cases, status counts {histogram}")
    assert cases > len(operations) * EXAMPLES
    assert server_errors == [], "\n\n".join(server_errors[:10])
