"""What the REST front takes in before it works: the key before the body, small bodies, Host/Origin.

The API process's memory is read from /proc around each oversized request: its peak (VmHWM,
reset before the request) may grow by far less than the body, which the API must never hold.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.helpers import Server, start_server, stop_server, tenant_of

pytestmark = pytest.mark.e2e

MIB = 1 << 20
BODY_MIB = 150
# Far less than the body: what the API may hold of a refused request (buffers, parsing a chunk).
MAX_GROWTH_MIB = 40
JSON_LIMIT = MIB  # the default RAGLINE_API__MAX_JSON_BYTES


@dataclass(frozen=True)
class Api:
    server: Server
    pid: int

    def peak_growth_mib(self, send: Any) -> tuple[httpx.Response, float]:
        """The response to `send()` and how far above its resident memory before it the API peaked."""
        proc = Path(f"/proc/{self.pid}")
        before = _status_kib(proc, "VmRSS")
        (proc / "clear_refs").write_text("5")  # resets VmHWM to the current resident size
        response = send()
        return response, (_status_kib(proc, "VmHWM") - before) / 1024


def _status_kib(proc: Path, field: str) -> int:
    line = next(line for line in (proc / "status").read_text().splitlines() if line.startswith(f"{field}:"))
    return int(line.split()[1])


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    handle, process = start_server(tmp_path_factory.mktemp("intake-api"), {})
    yield Api(handle, process.pid)
    try:
        stop_server(process)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _search_body() -> bytes:
    """A JSON search of BODY_MIB MiB, well-formed: all of it is a query."""
    return b'{"query": "' + b"a" * (BODY_MIB * MIB) + b'"}'


def _streamed(body: bytes) -> Iterator[bytes]:
    """The body without a declared length (chunked), so only counting it as it comes can refuse it."""
    for start in range(0, len(body), MIB):
        yield body[start : start + MIB]


def _envelope(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text[:500]
    body: dict[str, Any] = response.json()
    assert set(body) == {"code", "message", "details"}
    assert body["code"] == code
    return body


def test_a_body_without_a_key_is_refused_before_it_is_read(api: Api) -> None:
    body = _search_body()
    headers = {"Content-Type": "application/json"}
    growth: dict[str, float] = {}
    with httpx.Client(base_url=api.server.url, timeout=300) as client:
        for shape, content in (("declared", body), ("chunked", _streamed(body))):
            response, growth[shape] = api.peak_growth_mib(
                lambda content=content: client.post("/v1/search", content=content, headers=headers)
            )
            _envelope(response, 401, "AUTH_ERROR")
    print(f"{BODY_MIB} MiB unauthenticated search: API peak memory grew {growth} MiB")
    assert all(mib < MAX_GROWTH_MIB for mib in growth.values()), growth


def test_a_search_body_over_the_json_limit_is_refused_as_it_streams(api: Api) -> None:
    body = _search_body()
    headers = {"Content-Type": "application/json", "X-Api-Key": api.server.keys["a_read"]}
    growth: dict[str, float] = {}
    with httpx.Client(base_url=api.server.url, timeout=300) as client:
        for shape, content in (("declared", body), ("chunked", _streamed(body))):
            response, growth[shape] = api.peak_growth_mib(
                lambda content=content: client.post("/v1/search", content=content, headers=headers)
            )
            refusal = _envelope(response, 413, "TOO_LARGE")
            assert refusal["details"] == {"limit": JSON_LIMIT}
    print(f"{BODY_MIB} MiB authenticated search: API peak memory grew {growth} MiB")
    assert all(mib < MAX_GROWTH_MIB for mib in growth.values()), growth


def test_only_uploads_take_bodies_over_the_json_limit(api: Api) -> None:
    kb = f"intake-{uuid.uuid4().hex[:8]}"
    padding = "x" * (2 * JSON_LIMIT)
    with api.server.client("a_admin") as client:
        assert client.post("/v1/kbs", json={"kb_id": kb, "name": kb}).status_code == 201
        for method, path, body in (
            ("POST", "/v1/kbs", {"kb_id": f"{kb}-2", "name": "big", "description": padding}),
            ("PATCH", f"/v1/kbs/{kb}", {"description": padding}),
            ("POST", f"/v1/kbs/{kb}/reembed", {"model": padding}),
            ("POST", "/v1/search", {"query": padding}),
        ):
            _envelope(client.request(method, path, json=body), 413, "TOO_LARGE")
        # An inline upload of the same size gets past the limit to validation (an unknown field
        # refuses it before anything is stored).
        upload = client.post(f"/v1/kbs/{kb}/documents", json={"content": padding, "unknown": 1})
        _envelope(upload, 422, "INVALID_ARGUMENT")
        assert client.get(f"/v1/kbs/{kb}").json()["description"] == ""


def test_a_foreign_origin_or_host_is_refused_and_plain_clients_pass(api: Api) -> None:
    server = api.server
    port = server.url.rsplit(":", 1)[1]
    with server.client("a_admin") as client:
        for headers, header in (
            ({"Origin": "https://attacker.example"}, "Origin"),
            ({"Origin": "null"}, "Origin"),
            ({"Host": "attacker.example"}, "Host"),
            ({"Host": f"attacker.example:{port}"}, "Host"),
            ({"Host": f"rebound.example:{port}", "Origin": f"http://rebound.example:{port}"}, "Host"),
        ):
            for method, path in (("GET", "/v1/kbs"), ("POST", "/v1/search")):
                refused = client.request(method, path, json={"query": "x"}, headers=headers)
                assert _envelope(refused, 403, "FORBIDDEN")["details"] == {"header": header}, headers
        # The CLI and httpx send no Origin; a page of the server's own origin sends its own.
        assert client.get("/v1/kbs").status_code == 200
        for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
            assert client.get("/v1/kbs", headers={"Origin": origin}).status_code == 200
        # Probes and metrics are asked by address (a kubelet, Prometheus): no Host check there.
        assert client.get("/healthz", headers={"Host": f"10.0.0.7:{port}"}).status_code == 200


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A second API on the same stack that opts in to tenant and KB names in its metrics."""
    handle, process = start_server(
        tmp_path_factory.mktemp("labelled-api"), {"RAGLINE_METRICS__TENANT_LABELS": "true"}
    )
    yield handle
    stop_server(process)


def _gauge(exposition: str, name: str) -> float:
    """The value of an unlabelled series (0 when absent)."""
    for line in exposition.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return 0.0


def test_metrics_name_no_tenant_or_kb_unless_asked(api: Api, labelled: Server) -> None:
    server = api.server
    kb = f"lanes-{uuid.uuid4().hex[:8]}"
    tenant = tenant_of(server, "a_admin")
    files = [("files", (f"note-{i}.txt", f"Lane note {i}: the tide came in.\n".encode(), "text/plain"))
             for i in range(30)]  # fmt: skip
    with server.client("a_admin") as client:
        assert (
            client.post(
                "/v1/kbs", json={"kb_id": kb, "name": kb, "settings": {"pii_policy": "off"}}
            ).status_code
            == 201
        )
        uploaded = client.post(f"/v1/kbs/{kb}/documents", files=files, data={"priority": "bulk"})
        assert uploaded.status_code == 202, uploaded.text
        # Both APIs read the same fair lanes from Redis: scrape both while the tenant's work waits.
        for _ in range(240):
            plain = client.get("/metrics").text
            named = httpx.get(f"{labelled.url}/metrics", timeout=30).text
            if _gauge(plain, "ragline_fair_waiting") > 0 and _gauge(named, "ragline_fair_waiting") > 0:
                break
            time.sleep(0.25)
        else:
            pytest.fail("no scrape saw the bulk documents waiting in their lane")
        assert tenant not in plain
        assert kb not in plain
        assert "ragline_fair_lane_depth{" not in plain
        assert _gauge(plain, "ragline_fair_lane_depth_max") > 0
        assert f'ragline_fair_lane_depth{{lane="{tenant}' in named
        # What the scrapes needed is seen: the notes need not be processed.
        assert client.delete(f"/v1/kbs/{kb}").status_code == 204
