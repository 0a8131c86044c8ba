"""The architecture's import rules (docs/architecture.md#layout-and-layering), checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import shared

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = {"services": {"workers"}, "workers": {"services"}, "shared": {"services", "workers"}}


def _imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_does_not_import_its_forbidden_neighbours(package: str) -> None:
    sources = sorted((REPO / package).rglob("*.py"))
    assert sources, f"no sources found under {package}/"
    offenders = {
        str(path.relative_to(REPO)): sorted(_imported_roots(path) & FORBIDDEN[package]) for path in sources
    }
    assert {path: names for path, names in offenders.items() if names} == {}


# Rules between folders inside a package, or with a top-level tool: (sources, forbidden module prefixes).
# The MCP front shares only services/core with the REST front (the API process mounts it, so the
# reverse import is the composition, not a dependency); the bench reaches the services over HTTP only.
FORBIDDEN_PREFIXES = {
    "services/mcp": ("services.api",),
    "services": ("bench",),
    "bench": ("services",),
}


def _imported_modules(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def _forbidden(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(f"{p}.") for p in prefixes))


@pytest.mark.parametrize("folder", sorted(FORBIDDEN_PREFIXES))
def test_folder_does_not_import_its_forbidden_neighbours(folder: str) -> None:
    sources = sorted((REPO / folder).rglob("*.py"))
    assert sources, f"no sources found under {folder}/"
    offenders = {
        str(path.relative_to(REPO)): _forbidden(_imported_modules(path), FORBIDDEN_PREFIXES[folder])
        for path in sources
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_the_prefix_rule_tells_a_module_from_a_namesake() -> None:
    assert _forbidden({"services.api.app", "services.apikeys", "bench"}, ("services.api",)) == [
        "services.api.app"
    ]
    assert _forbidden({"benchmarks", "bench.run"}, ("bench",)) == ["bench.run"]


def test_shared_is_the_package_inside_this_repository() -> None:
    # ../shared beside the checkout is the team handbook; it must never shadow the package.
    assert Path(shared.__file__).resolve().is_relative_to(REPO)
    assert Path(shared.__file__).resolve().parent == REPO / "shared"


# One owner per store (docs/architecture.md): only these modules send requests to OpenSearch.
OPENSEARCH_OWNERS = {
    "shared/registry.py",  # the knowledge-base and document indexes
    "shared/search/chunk_index.py",  # chunk writes, deletes, reads and the search phases
    "shared/search/schema.py",  # index creation and mappings
    "shared/search/placement.py",  # aliases and physical index resolution
    "shared/search/client.py",  # the client factory and the health probe
    "shared/sources/store.py",  # sources, their runs and their items
}
OWNER_SCAN = ("shared", "workers", "services", "bench")
_CLIENT_NAMES = {"client", "_client", "opensearch", "os_client", "search_client"}
_CLIENT_METHODS = {
    "bulk",
    "clear_scroll",
    "count",
    "create",
    "delete",
    "delete_by_query",
    "exists",
    "explain",
    "field_caps",
    "get",
    "get_source",
    "index",
    "info",
    "mget",
    "msearch",
    "open_point_in_time",
    "ping",
    "reindex",
    "scroll",
    "search",
    "termvectors",
    "update",
    "update_by_query",
}
_CLIENT_NAMESPACES = {"cat", "cluster", "indices", "ingest", "nodes", "snapshot", "tasks", "transport"}
# Outside the owners, opensearchpy may be imported for the client's type (wiring, annotations) and
# for its exceptions (mapping them to error codes), nothing else.
_IMPORTABLE = {"OpenSearch"}


def _chain(node: ast.expr) -> list[str]:
    """`self.state.client.search` -> ["self", "state", "client", "search"]; [] for other shapes."""
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(names)]
    return []


def _not_opensearch(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Names that hold another kind of client (a Redis client named `client`): parameters
    annotated with another type, and names assigned a Redis client."""
    params = [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]
    typed = {
        p.arg for p in params if p.annotation is not None and "OpenSearch" not in ast.unparse(p.annotation)
    }
    # `client = redis.Redis.from_url(...)` in the function's own body
    made = {
        target.id
        for node in ast.walk(function)
        if isinstance(node, ast.Assign) and "redis" in ast.unparse(node.value).lower()
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    return typed | made


def opensearch_violations(path: str, source: str) -> list[str]:
    """`line: what` for each OpenSearch request or opensearchpy import in a non-owner module."""
    if path in OPENSEARCH_OWNERS:
        return []
    found: list[str] = []

    def visit(node: ast.AST, others: set[str]) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            others = (others - {a.arg for a in node.args.args}) | _not_opensearch(node)
        if isinstance(node, ast.Import):
            roots = [a.name for a in node.names if a.name.split(".")[0] == "opensearchpy"]
            found.extend(f"{node.lineno}: import {name}" for name in roots)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "opensearchpy":
            if node.module != "opensearchpy.exceptions":
                bad = [
                    a.name for a in node.names if node.module != "opensearchpy" or a.name not in _IMPORTABLE
                ]
                found.extend(f"{node.lineno}: from {node.module} import {name}" for name in bad)
        elif isinstance(node, ast.Call):
            chain = _chain(node.func)
            if chain[:1] in (["opensearchpy"], ["helpers"]):
                found.append(f"{node.lineno}: {'.'.join(chain)}()")
            for at, name in enumerate(chain[:-1]):
                if name not in _CLIENT_NAMES or (at == 0 and name in others):
                    continue
                following = chain[at + 1]
                if following in _CLIENT_NAMESPACES or (following in _CLIENT_METHODS and at + 2 == len(chain)):
                    found.append(f"{node.lineno}: {'.'.join(chain)}()")
                    break
        for child in ast.iter_child_nodes(node):
            visit(child, others)

    visit(ast.parse(source, filename=path), set())
    return found


# Modules still moving onto the owners within issue #22; each entry fails this test once it is
# no longer needed, so the list only shrinks.
_MOVING_ONTO_OWNERS: set[str] = set()


def test_no_opensearch_request_outside_the_store_owners() -> None:
    sources = sorted(p for package in OWNER_SCAN for p in (REPO / package).rglob("*.py"))
    offenders = {
        str(path.relative_to(REPO)): found
        for path in sources
        if (found := opensearch_violations(str(path.relative_to(REPO)), path.read_text()))
    }
    assert {path: found for path, found in offenders.items() if path not in _MOVING_ONTO_OWNERS} == {}
    assert set(offenders) >= _MOVING_ONTO_OWNERS, "drop the modules now on the owners from the list"


def test_the_owner_check_sees_requests_through_every_client_name() -> None:
    source = (
        "import opensearchpy\n"
        "from opensearchpy import helpers\n"
        "from opensearchpy import OpenSearch\n"
        "from opensearchpy.exceptions import NotFoundError\n"
        "def f(client, ctx, redis_client: 'Redis') -> None:\n"
        "    client.search(index='x')\n"
        "    self.client.indices.refresh(index='x')\n"
        "    self._client.mget(body={})\n"
        "    ctx.registry.client.delete_by_query(index='x', body={})\n"
        "    opensearchpy.helpers.bulk(client, [])\n"
        "    helpers.scan(client)\n"
        "    client.transport.perform_request('GET', '/')\n"
        "def g(client: 'redis.Redis') -> None:\n"
        "    client.get('key')\n"
        "def h() -> None:\n"
        "    client = redis.Redis.from_url('redis://')\n"
        "    client.delete('key')\n"
        "    registry.get_kb('t', 'k')\n"
    )
    found = [line.split(":")[0] for line in opensearch_violations("services/x.py", source)]
    assert found == ["1", "2", "6", "7", "8", "9", "10", "11", "12"]
    assert opensearch_violations("shared/registry.py", source) == []
