"""Security tables over the live API, enumerated from the app so a new endpoint or tool is covered.

Tenant B's key against tenant A's knowledge bases, documents and batches leaks nothing; no key, a
wrong, an expired or a revoked key is refused everywhere but the public probes; a read key is
refused on every write; key files apply without a restart; secrets stay out of the server log;
errors echo neither content nor stack traces; every MCP transport checks Host and Origin.
"""

from __future__ import annotations

import json
import re
import secrets
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from fastapi.routing import APIRoute, iter_route_contexts
from mcp import ClientSession
from mcp.types import CallToolResult, Tool

from services.api.app import create_app
from shared.config import load_settings
from tests.e2e.helpers import (
    MCP_INITIALIZE,
    Server,
    call,
    error_text,
    extra_keys,
    http_session,
    tenant_of,
    wait_ready,
    wait_until,
)

pytestmark = pytest.mark.e2e

# Answer without a key, on purpose: probes for load balancers and Prometheus, and the API's docs.
PUBLIC = {
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/docs/oauth2-redirect"),
    ("GET", "/redoc"),
}
MCP_TRANSPORTS = {"/mcp", "/mcp/sse", "/mcp/messages"}
READ_POSTS = {("POST", "/v1/search")}  # a query carried in a body: reads, changes nothing
# Tools that make a new object in the caller's own namespace, where another tenant's id is free.
CREATES = {"create_knowledge_base"}
SCOPES = {"kb_id", "doc_id", "batch_id", "kb_ids", "source_id"}
BAD_IDENTITIES = ["none", "wrong", "wrong_bearer", "expired", "revoked"]
ACCEPT = {"accept": "application/json, text/event-stream"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str  # as declared, e.g. /v1/kbs/{kb_id}/documents/{doc_id:path}
    body_required: bool
    query_required: tuple[str, ...] = ()  # query parameters the endpoint cannot do without


@dataclass(frozen=True)
class TenantA:
    kb: str
    doc: str
    batch: str
    query: str  # a word of A's document: B searching for it must find nothing
    canaries: tuple[str, ...]  # strings only A's objects hold; seen by B = leaked
    source: str  # a folder source of A's KB, synced once
    run: str  # that sync's run
    folder: str  # the source's directory

    def leaked(self, text: str) -> int:
        return sum(text.count(canary) for canary in self.canaries)


@dataclass(frozen=True)
class AppSurface:
    endpoints: list[Endpoint]
    transports: set[str]


@pytest.fixture(scope="module")
def surface(server: Server) -> AppSurface:
    """Every route of the app as built by `create_app`: REST endpoints, public probes, MCP transports."""
    settings = load_settings(
        auth={"keys_file": str(server.keys_file), "api_keys": [], "allow_anonymous": False}
    )
    app = create_app(settings)
    spec = app.openapi()
    endpoints: list[Endpoint] = []
    transports: set[str] = set()
    for context in iter_route_contexts(app.router.routes):
        route = context.route
        path = str(getattr(route, "path", ""))
        if path in MCP_TRANSPORTS:
            transports.add(path)
            continue
        methods = sorted(set(getattr(route, "methods", None) or ()) - {"HEAD"})
        assert methods, f"{path}: a route without methods; classify it in this test"
        for method in methods:
            if not isinstance(route, APIRoute):
                assert (method, path) in PUBLIC, f"{method} {path}: not an API route; is it public?"
            operation = spec["paths"].get(re.sub(r"\{(\w+):\w+\}", r"{\1}", path), {}).get(method.lower(), {})
            required_query = tuple(
                p["name"]
                for p in operation.get("parameters", [])
                if p.get("in") == "query" and p.get("required")
            )
            body_required = bool(operation.get("requestBody", {}).get("required"))
            endpoints.append(Endpoint(method, path, body_required, required_query))
    assert transports == MCP_TRANSPORTS
    return AppSurface(endpoints, transports)


def _seed(server: Server) -> TenantA:
    """A knowledge base of tenant A with one ready document and its batch, and a folder source
    synced once, marked with canaries."""
    mark = secrets.token_hex(4)
    name, description, tag = f"namecanary{mark}", f"desccanary{mark}", f"tagcanary{mark}"
    roots = load_settings().sources.folder_roots
    assert roots, "RAGLINE_SOURCES__FOLDER_ROOTS is not set: run the tests with deploy/local/test.sh"
    folder = roots[0] / f"security-{mark}"
    folder.mkdir(parents=True)
    (folder / "note.txt").write_text(f"A note of the source: sourcecanary{mark}.")
    content, meta, query = f"contentcanary{mark}", f"metacanary{mark}", f"zebravault{mark}"
    kb, doc, batch = f"kb-a-{mark}", f"private-{mark}.txt", f"batch-a-{mark}"
    with server.client("a_admin") as client:
        created = client.post(
            "/v1/kbs",
            json={
                "kb_id": kb,
                "name": name,
                "description": description,
                "tags": [tag],
                "settings": {"pii_policy": "off"},
            },
        )
        assert created.status_code == 201, created.text
        text = f"{content}\n\nThe {query} code is kept in drawer seven of the archive room."
        body = {"content": text, "doc_id": doc, "metadata": {"owner": meta}, "batch_id": batch}
        uploaded = client.post(f"/v1/kbs/{kb}/documents", json=body)
        assert uploaded.status_code == 202, uploaded.text
        assert wait_ready(client, kb, [doc])[doc]["status"] == "ready"
        wait_until(lambda: client.get(f"/v1/batches/{batch}").status_code == 200)
        wait_until(
            lambda: bool(
                client.post("/v1/search", json={"query": query, "mode": "keyword"}).json()["results"]
            )
        )
        source = f"src-a-{mark}"
        spec = {
            "type": "folder",
            "source_id": source,
            "name": f"srcname{mark}",
            "settings": {"path": str(folder)},
        }
        assert client.post(f"/v1/kbs/{kb}/sources", json=spec).status_code == 201
        run = client.post(f"/v1/kbs/{kb}/sources/{source}/sync").json()["run_id"]
        wait_until(
            lambda: client.get(f"/v1/kbs/{kb}/sources/{source}/runs/{run}").json()["status"] == "succeeded"
        )
    canaries = (name, description, tag, content, meta, f"srcname{mark}", str(folder))
    return TenantA(kb, doc, batch, query, canaries, source, run, str(folder))


@pytest.fixture(scope="module")
def tenant_a(server: Server) -> TenantA:
    return _seed(server)


def assert_a_intact(server: Server, a: TenantA) -> int:
    """Count A's objects another tenant changed (0 expected): KB, document, batch, search."""
    changed = 0
    with server.client("a_read") as owner:
        kb = owner.get(f"/v1/kbs/{a.kb}")
        changed += kb.status_code != 200 or kb.json()["name"] != a.canaries[0]
        doc = owner.get(f"/v1/kbs/{a.kb}/documents/{a.doc}").json()
        changed += doc.get("status") != "ready" or doc.get("content_version") != 1
        changed += owner.get(f"/v1/batches/{a.batch}").status_code != 200
        hits = owner.post("/v1/search", json={"query": a.query, "kb_ids": [a.kb]}).json()["results"]
        changed += [h["doc_id"] for h in hits][:1] != [a.doc]
        source = owner.get(f"/v1/kbs/{a.kb}/sources/{a.source}")
        changed += source.status_code != 200 or source.json()["deleting"]
        changed += owner.get(f"/v1/kbs/{a.kb}/sources/{a.source}/runs/{a.run}").status_code != 200
    return int(changed)


def _path(endpoint: Endpoint, a: TenantA) -> str:
    values = {"kb_id": a.kb, "doc_id": a.doc, "batch_id": a.batch, "source_id": a.source, "run_id": a.run}

    def fill(match: re.Match[str]) -> str:
        name = match.group(1).split(":")[0]
        if name not in values:
            pytest.fail(f"{endpoint.method} {endpoint.path}: no test value for the path parameter {name}")
        return quote(values[name], safe="")

    return re.sub(r"\{([^}]+)\}", fill, endpoint.path)


def _params(endpoint: Endpoint, a: TenantA) -> dict[str, str]:
    """Values for the endpoint's required query parameters, aimed at A's objects."""
    values = {"doc_id": a.doc, "chunk_idx": "0"}
    missing = [name for name in endpoint.query_required if name not in values]
    if missing:
        pytest.fail(f"{endpoint.method} {endpoint.path}: no test value for the query parameters {missing}")
    return {name: values[name] for name in endpoint.query_required}


def _bodies(endpoint: Endpoint, a: TenantA) -> list[dict[str, Any] | None]:
    """Valid bodies aimed at A's objects; a new endpoint that takes a body must be added here."""
    table: dict[tuple[str, str], list[dict[str, Any] | None]] = {
        ("POST", "/v1/kbs"): [{"kb_id": a.kb, "name": "made by b"}],
        ("PATCH", "/v1/kbs/{kb_id}"): [{"name": "renamed by b", "description": "changed by b"}],
        ("POST", "/v1/kbs/{kb_id}/reembed"): [{"model": "all-MiniLM-L6-v2"}],
        ("POST", "/v1/kbs/{kb_id}/documents"): [{"content": "written by b", "doc_id": a.doc}],
        ("POST", "/v1/kbs/{kb_id}/sources"): [
            {"type": "folder", "source_id": a.source, "settings": {"path": a.folder}}
        ],
        ("PATCH", "/v1/kbs/{kb_id}/sources/{source_id}"): [{"max_deleted_share": 1, "schedule": None}],
        ("POST", "/v1/search"): [
            {"query": a.query, "kb_ids": [a.kb]},
            {"query": a.query},
            {"query": a.query, "mode": "keyword", "filters": {"doc_ids": [a.doc]}},
        ],
    }
    if (endpoint.method, endpoint.path) in table:
        return table[(endpoint.method, endpoint.path)]
    if endpoint.body_required:
        pytest.fail(f"{endpoint.method} {endpoint.path}: add its request body to _bodies")
    return [None]


def _identity(server: Server, who: str) -> dict[str, str]:
    """Headers presenting a key by name, or one of the bad identities."""
    bad = {
        "none": {},
        "wrong": {"X-Api-Key": f"test-wrong-{secrets.token_hex(16)}"},
        "wrong_bearer": {"Authorization": f"Bearer test-wrong-{secrets.token_hex(16)}"},
        "expired": {"X-Api-Key": server.keys["a_expired"]},
        "revoked": {"Authorization": f"Bearer {server.keys['a_revoked']}"},
    }
    return bad[who] if who in bad else {"X-Api-Key": server.keys[who]}


def _protected(surface: AppSurface) -> list[Endpoint]:
    return [e for e in surface.endpoints if (e.method, e.path) not in PUBLIC]


def test_tenant_b_sees_and_changes_nothing_of_tenant_a_over_rest(server: Server, surface: AppSurface) -> None:
    a = _seed(server)
    # Calls that name one of A's objects first; then the collection calls, where B's own
    # knowledge base with A's id (POST /v1/kbs) proves that ids are per tenant.
    ordered = sorted(_protected(surface), key=lambda e: "{" not in e.path)
    calls, leaked, statuses = 0, 0, []
    with server.client("b_admin") as b:
        for endpoint in ordered:
            for body in _bodies(endpoint, a):
                response = b.request(
                    endpoint.method, _path(endpoint, a), params=_params(endpoint, a), json=body
                )
                calls += 1
                statuses.append(response.status_code)
                leaked += a.leaked(response.text)
                if "{" in endpoint.path:  # names A's object: only NOT_FOUND will do
                    refused = response.status_code == 404 and response.json()["code"] == "NOT_FOUND"
                    leaked += not refused
                    assert refused, (endpoint, body, response.status_code, response.text)
                else:
                    assert response.status_code in (200, 201, 202, 404), (endpoint, body, response.text)
    leaked += assert_a_intact(server, a)
    print(
        f"REST tenant isolation: {len(ordered)} endpoints, {calls} calls as tenant B, leaked items {leaked}"
    )
    print(f"  status counts: { {s: statuses.count(s) for s in sorted(set(statuses))} }")
    assert leaked == 0


def _tool_arguments(tool: Tool, a: TenantA) -> list[dict[str, Any]]:
    """Valid arguments aimed at A's objects, then the same without the optional scopes."""
    values: dict[str, Any] = {
        "kb_id": a.kb,
        "doc_id": a.doc,
        "batch_id": a.batch,
        "kb_ids": [a.kb],
        "query": a.query,
        "content": "written by b",
        "name": "made by b",
        "source_id": a.source,
        "source": {"type": "folder", "source_id": a.source, "settings": {"path": a.folder}},
        "change": {"max_deleted_share": 1, "schedule": None},
    }
    properties = set(tool.inputSchema.get("properties", {}))
    required = set(tool.inputSchema.get("required", []))
    if required - set(values):
        pytest.fail(f"tool {tool.name}: no test value for {sorted(required - set(values))}")
    full = {k: values[k] for k in sorted(properties) if k in values}
    optional = {k for k in full if k in SCOPES and k not in required}
    variants = [full]
    if optional:
        variants.append({k: v for k, v in full.items() if k not in optional})
    return variants


def _result_text(result: CallToolResult) -> str:
    texts = [getattr(block, "text", "") for block in result.content]
    return json.dumps(result.structuredContent) + "".join(texts)


async def _tools(session: ClientSession) -> list[Tool]:
    tools = (await session.list_tools()).tools
    assert tools
    return tools


@pytest.mark.anyio
async def test_tenant_b_sees_and_changes_nothing_of_tenant_a_over_mcp(server: Server) -> None:
    a = _seed(server)
    calls, leaked = 0, 0
    async with http_session(server, "b_admin") as b:
        tools = sorted(await _tools(b), key=lambda t: t.name in CREATES)
        for tool in tools:
            for arguments in _tool_arguments(tool, a):
                result = await b.call_tool(tool.name, arguments)
                calls += 1
                leaked += a.leaked(_result_text(result))
                if tool.name in CREATES or not SCOPES & set(arguments):
                    ok = not result.isError or error_text(result).startswith("CONFLICT: ")
                else:  # names A's object: only NOT_FOUND will do
                    ok = result.isError and error_text(result).startswith("NOT_FOUND: ")
                    leaked += not ok
                assert ok, (tool.name, arguments, result.content)
    leaked += assert_a_intact(server, a)
    print(f"MCP tenant isolation: {len(tools)} tools, {calls} calls as tenant B, leaked items {leaked}")
    assert leaked == 0


def test_only_the_public_probes_answer_without_a_valid_key(
    server: Server, surface: AppSurface, tenant_a: TenantA
) -> None:
    answered: set[tuple[str, str]] = set()
    calls = 0
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for endpoint in surface.endpoints:
            body = _bodies(endpoint, tenant_a)[0]
            for who in BAD_IDENTITIES:
                response = client.request(
                    endpoint.method,
                    _path(endpoint, tenant_a),
                    params=_params(endpoint, tenant_a),
                    json=body,
                    headers=_identity(server, who),
                )
                calls += 1
                if response.status_code == 401:
                    assert response.json()["code"] == "AUTH_ERROR", response.text
                else:
                    answered.add((endpoint.method, endpoint.path))
                    assert response.status_code == 200, (endpoint, who, response.status_code)
    print(
        f"REST auth: {len(surface.endpoints)} endpoints x {len(BAD_IDENTITIES)} bad identities: {calls} calls"
    )
    assert answered == PUBLIC


def test_a_read_key_is_refused_on_every_write_endpoint(
    server: Server, surface: AppSurface, tenant_a: TenantA
) -> None:
    writes = reads = 0
    with server.client("a_read") as reader:
        for endpoint in _protected(surface):
            response = reader.request(
                endpoint.method,
                _path(endpoint, tenant_a),
                params=_params(endpoint, tenant_a),
                json=_bodies(endpoint, tenant_a)[0],
            )
            if endpoint.method == "GET" or (endpoint.method, endpoint.path) in READ_POSTS:
                reads += 1
                assert response.status_code == 200, (endpoint, response.text)
            else:
                writes += 1
                assert response.status_code == 403, (endpoint, response.text)
                assert response.json()["code"] == "FORBIDDEN"
                # RFC 6750 section 3.1: the scope that would have been enough.
                needed = response.json()["details"]["required_scope"]
                assert needed in ("ragline:write", "ragline:admin"), (endpoint, needed)
                assert response.headers["www-authenticate"] == (
                    f'Bearer realm="ragline", error="insufficient_scope", scope="{needed}"'
                )
    print(f"REST roles: read key refused on {writes} write endpoints, served on {reads} read endpoints")
    assert writes > 0
    assert assert_a_intact(server, tenant_a) == 0


async def _raw(
    client: httpx.AsyncClient, identity: dict[str, str], message: dict[str, Any], session: str | None = None
) -> httpx.Response:
    headers = {**ACCEPT, **identity, **({"mcp-session-id": session} if session else {})}
    return await client.post("/mcp", json=message, headers=headers)


async def _raw_session(client: httpx.AsyncClient, identity: dict[str, str]) -> str:
    """An initialized streamable-HTTP session, by hand: its id."""
    response = await _raw(client, identity, MCP_INITIALIZE)
    assert response.status_code == 200, response.text
    session = response.headers["mcp-session-id"]
    notified = await _raw(
        client, identity, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session
    )
    assert notified.status_code == 202, notified.text
    return session


def _tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": secrets.randbelow(10**6), "method": "tools/call", "params": params}


@pytest.mark.anyio
async def test_every_mcp_transport_and_tool_refuses_bad_keys(server: Server, tenant_a: TenantA) -> None:
    async with http_session(server, "a_admin") as session:
        tools = await _tools(session)
    calls = 0
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        good = _identity(server, "a_admin")
        session_id = await _raw_session(client, good)
        for who in BAD_IDENTITIES:
            identity = _identity(server, who)
            transports = [
                await _raw(
                    client, identity, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
                ),
                await client.get("/mcp/sse", headers=identity),
                await client.post(f"/mcp/messages/?session_id={uuid.uuid4().hex}", json={}, headers=identity),
            ]
            # A session opened with a good key does not carry a bad one through.
            for tool in tools:
                arguments = _tool_arguments(tool, tenant_a)[0]
                transports.append(await _raw(client, identity, _tool_call(tool.name, arguments), session_id))
            for response in transports:
                calls += 1
                assert response.status_code == 401, (who, response.request.url, response.text)
                assert response.json()["code"] == "AUTH_ERROR"
        still = await _raw(client, good, _tool_call("list_knowledge_bases", {}), session_id)
        assert still.status_code == 200
        assert tenant_a.kb in still.text
    print(
        f"MCP auth: 3 transports + {len(tools)} tools x {len(BAD_IDENTITIES)} bad identities = {calls} calls"
    )


@pytest.mark.anyio
async def test_a_read_key_is_refused_on_every_write_tool(server: Server, tenant_a: TenantA) -> None:
    writes = reads = 0
    async with http_session(server, "a_read") as reader:
        for tool in await _tools(reader):
            result = await reader.call_tool(tool.name, _tool_arguments(tool, tenant_a)[0])
            read_only = tool.annotations is not None and tool.annotations.readOnlyHint is True
            if read_only:
                reads += 1
                assert not result.isError, (tool.name, result.content)
            else:
                writes += 1
                assert error_text(result).startswith("FORBIDDEN: "), (tool.name, result.content)
    print(f"MCP roles: read key refused on {writes} write tools, served on {reads} read-only tools")
    assert writes > 0
    assert assert_a_intact(server, tenant_a) == 0


@pytest.fixture
def rotating_key(server: Server) -> Iterator[tuple[str, Callable[..., None]]]:
    """A key of tenant A added to the running server's keys file, and a function that rewrites it."""
    secret = f"test-rotating-{secrets.token_hex(16)}"
    tenant = tenant_of(server, "a_admin")
    with extra_keys(server) as write_entries:

        def write(present: bool = True, **fields: Any) -> None:
            entry = {"key": secret, "tenant": tenant, "role": "admin", "name": "rotating", **fields}
            write_entries([entry] if present else [])

        yield secret, write


@pytest.mark.anyio
async def test_keys_file_edits_apply_at_once_to_rest_and_open_mcp_sessions(
    server: Server, rotating_key: tuple[str, Callable[..., None]]
) -> None:
    secret, write = rotating_key
    identity = {"Authorization": f"Bearer {secret}"}
    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        write(expires_at=future)
        assert (await client.get("/v1/kbs", headers=identity)).status_code == 200
        session = await _raw_session(client, identity)
        listed = await _raw(client, identity, _tool_call("list_knowledge_bases", {}), session)
        assert listed.status_code == 200
        changes: list[tuple[dict[str, Any], str]] = [
            ({"revoked": True, "expires_at": future}, "revoked"),
            ({"expires_at": past}, "expired"),
            ({"present": False}, "not valid"),
        ]
        for fields, reason in changes:
            write(**fields)
            rest = await client.get("/v1/kbs", headers=identity)
            mcp = await _raw(client, identity, _tool_call("list_knowledge_bases", {}), session)
            for response in (rest, mcp):
                assert response.status_code == 401, (reason, response.text)
                assert response.json()["code"] == "AUTH_ERROR"
                assert reason in response.json()["message"]
        write(revoked=False)
        assert (await client.get("/v1/kbs", headers=identity)).status_code == 200


def test_refused_and_accepted_keys_never_reach_the_server_log(server: Server, tenant_a: TenantA) -> None:
    probe = f"log-probe-{secrets.token_hex(6)}"
    wrong = f"test-wrong-{secrets.token_hex(16)}"
    presented = [wrong, *server.keys.values()]
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for headers in [
            {"X-Api-Key": wrong},
            {"Authorization": f"Bearer {wrong}"},
            *({"X-Api-Key": key} for key in server.keys.values()),
            *({"Authorization": f"Bearer {key}"} for key in server.keys.values()),
        ]:
            client.get(f"/v1/kbs/{probe}", headers=headers)
            client.post(
                "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers={**ACCEPT, **headers}
            )
    log = server.log.read_text(errors="replace")
    assert probe in log, "the probe requests are not in the server log: is it captured?"
    found = [key[:12] + "…" for key in presented if key in log]
    print(
        f"server log: {len(log.splitlines())} lines, {len(presented)} keys presented, keys found {len(found)}"
    )
    assert found == []


def test_errors_echo_neither_content_nor_stack_traces(server: Server, tenant_a: TenantA) -> None:
    canary = f"echocanary{secrets.token_hex(6)}"
    kb = tenant_a.kb
    with server.client("a_admin") as client:
        responses = [
            client.post(f"/v1/kbs/{kb}/documents", json={"content": canary, "surprise": canary}),
            client.post(f"/v1/kbs/{kb}/documents", json={"content": canary, "metadata": canary}),
            client.post(
                f"/v1/kbs/{kb}/documents",
                files=[("files", ("a.txt", canary.encode(), "text/plain"))],
                data={"metadata": "{" + canary},
            ),
            client.post("/v1/kbs", json={"kb_id": f"../{canary}", "name": canary * 100}),
            client.patch(f"/v1/kbs/{kb}", json={"name": canary, "settings": canary}),
            client.post("/v1/search", json={"query": canary, "top_k": canary}),
            client.post(
                "/v1/search",
                json={"query": canary, "filters": {"metadata": {"x": {"range": {"gte": canary}}}}},
            ),
            client.post(
                "/v1/search",
                content=b'{"query": "' + canary.encode(),
                headers={"content-type": "application/json"},
            ),
            client.get(f"/v1/kbs/{kb}/documents", params={"cursor": canary, "status": canary}),
        ]
        failed_doc = f"broken-{canary[-6:]}.pdf"
        pdf = b"%PDF-1.7\n1 0 obj << /Length 999999 >> stream\n" + canary.encode() * 20 + b"\nendstream"
        upload = client.post(
            f"/v1/kbs/{kb}/documents", files=[("files", (failed_doc, pdf, "application/pdf"))]
        )
        assert upload.status_code == 202, upload.text
        failed = wait_ready(client, kb, [failed_doc])[failed_doc]
    statuses = [r.status_code for r in responses]
    print(f"error responses: {statuses}; broken PDF ended {failed['status']} {failed.get('error')}")
    for response in responses:
        assert 400 <= response.status_code < 500, (response.request.url, response.status_code, response.text)
        assert set(response.json()) == {"code", "message", "details"}
        assert canary not in response.text, response.text
        assert "Traceback" not in response.text
    assert failed["status"] == "failed"
    assert canary not in json.dumps(failed)


@pytest.mark.anyio
async def test_mcp_tool_errors_echo_neither_content_nor_stack_traces(
    server: Server, tenant_a: TenantA
) -> None:
    canary = f"echocanary{secrets.token_hex(6)}"
    async with http_session(server, "a_admin") as session:
        cases: list[tuple[str, dict[str, Any]]] = [
            ("ingest", {"kb_id": tenant_a.kb, "content": canary, "wait_seconds": -1}),
            ("ingest", {"kb_id": tenant_a.kb, "content_base64": canary + "%%"}),
            ("ingest", {"kb_id": tenant_a.kb, "content": canary, "metadata": canary}),
            ("create_knowledge_base", {"kb_id": f"../{canary}", "name": canary}),
            ("search", {"query": canary, "top_k": canary}),
            ("search", {"query": canary, "filters": {"metadata": {"x": {"range": {"gte": canary}}}}}),
            ("read_document", {"kb_id": tenant_a.kb, "doc_id": canary, "window": canary}),
        ]
        for tool, arguments in cases:
            result = await session.call_tool(tool, arguments)
            text = error_text(result)
            assert canary not in text, (tool, text)
        assert (await call(session, "list_knowledge_bases"))["knowledge_bases"]


@pytest.mark.anyio
async def test_every_mcp_transport_checks_host_and_origin(server: Server) -> None:
    key = {"X-Api-Key": server.keys["a_admin"]}
    cases = [
        ("POST", "/mcp", {"Origin": "http://evil.example"}, 403),
        ("POST", "/mcp", {"Host": "evil.example"}, 421),
        ("GET", "/mcp/sse", {"Origin": "http://evil.example"}, 403),
        ("GET", "/mcp/sse", {"Host": "evil.example"}, 421),
        ("POST", f"/mcp/messages/?session_id={uuid.uuid4().hex}", {"Origin": "http://evil.example"}, 403),
        ("POST", f"/mcp/messages/?session_id={uuid.uuid4().hex}", {"Host": "evil.example"}, 421),
    ]
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        for method, path, headers, status in cases:
            body = None if method == "GET" else ping
            response = await client.request(method, path, json=body, headers={**ACCEPT, **key, **headers})
            assert response.status_code == status, (method, path, headers, response.text)
    log = server.log.read_text(errors="replace")
    assert "Request validation failed" not in log
