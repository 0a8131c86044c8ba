"""Query latency: REST and MCP against the service's own embedding + `_msearch` sent straight."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from bench.mcp_latency import client_validation_ms, mcp_search_ms, paired_ms
from bench.session import Bench, latency_summary
from shared.search import chunk_index
from shared.search.queries import fetch_body
from shared.search.requests import SearchRequest

# Which part of the latency phase each query goes to, in turn: concurrency 8 (the target's) gets
# four of every eight, so its p95 rests on 300 queries a path, not a handful of slow ones; the
# paired comparison (REST, MCP, bare MCP, the stdio proxy) gets two, 150 queries a path: its
# target's margin is about a millisecond.
LATENCY_PARTS = ("c1", "c8", "c8", "c8", "c8", "c32", "paired", "paired")
LATENCY_QUERIES, LATENCY_QUERIES_QUICK = 600, 40
LATENCY_ROUNDS = 5  # the paths take turns in up to this many rounds per concurrency


def taking_turns(
    paths: dict[str, Callable[[list[str]], list[float]]], queries: list[str], concurrency: int
) -> dict[str, list[float]]:
    """Each path's latencies over `queries`, the paths taking turns in rounds (who starts turning
    each round), so that a shared machine's drift during the phase meets all of them alike.

    A round holds at least four queries per client, or the concurrency would never be reached.
    """
    rounds = max(1, min(LATENCY_ROUNDS, len(queries) // (4 * concurrency)))
    out: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    for i in range(rounds):
        block = queries[i::rounds]
        for name in names[i % len(names) :] + names[: i % len(names)]:
            out[name] += paths[name](block)
    return out


def latency_figures(bench: Bench, kb: str, queries: list[str], server: str, api_key: str) -> None:
    """Each concurrency gets its own queries and each path its own strings of them, so no path
    answers from a warm cache; the paths take turns (see `taking_turns`)."""
    searcher = bench.services.searcher
    parts: dict[str, list[str]] = {part: [] for part in LATENCY_PARTS}
    for i, query in enumerate(queries):
        parts[LATENCY_PARTS[i % len(LATENCY_PARTS)]].append(query)

    tenant = chunk_index.kb_tenant(bench.client, bench.settings, kb)

    def raw(query: str) -> Callable[[], object]:
        def call() -> object:
            """The service's own OpenSearch requests, embedding included, sent straight: the
            arms, then the fetch of as many hits as a search returns (the arms' best, in turn)."""
            request = SearchRequest(query=query, kb_ids=[kb])
            bodies = searcher.arm_bodies(request, [{"term": {"kb_id": kb}}])
            lines: list[dict[str, Any]] = []
            for body in bodies.values():
                lines += [{"index": searcher.index}, body]
            arms = [r["hits"]["hits"] for r in chunk_index.search_arms(bench.client, lines)]
            best = dict.fromkeys(hit["_id"] for rank in zip(*arms, strict=False) for hit in rank)
            chosen = list(best)[: request.top_k]
            fetch = fetch_body(request, tenant, chosen)
            return chunk_index.fetch_hits(bench.client, [searcher.index], fetch)

        return call

    def rest(query: str) -> Callable[[], object]:
        return lambda: bench.remote.post("/v1/search", json={"query": query, "kb_ids": [kb]})

    def paths_at(c: int) -> dict[str, Callable[[list[str]], list[float]]]:
        """Raw, REST and MCP, each query a distinct string per path so no cache answers it."""
        return {
            "raw": lambda block: bench.timed(c, [raw(q) for q in block]),
            "rest": lambda block: bench.timed(c, [rest(f"{q} ") for q in block]),
            "mcp": lambda block: mcp_search_ms(server, api_key, kb, [f"{q}  " for q in block], c),
        }

    figures: dict[str, Any] = {}
    for concurrency in (1, 8, 32):
        chosen = parts[f"c{concurrency}"]
        bench.say(f"query latency at concurrency {concurrency} ({len(chosen)} queries per path)")
        for name, values in taking_turns(paths_at(concurrency), chosen, concurrency).items():
            figures[f"{name}_c{concurrency}"] = latency_summary(values)
    figures["rest_over_raw_p95_c8"] = round(
        figures["rest_c8"]["p95"] / max(figures["raw_c8"]["p95"], 1e-6), 3
    )
    bench.say(f"MCP against REST, query by query at concurrency 1 ({len(parts['paired'])} queries)")
    paired = paired_ms(server, api_key, kb, parts["paired"])
    for name, values in paired.items():
        figures[f"paired_{name}_c1"] = latency_summary(values)
    for name in ("mcp", "mcp_bare"):
        differences = [m - r for m, r in zip(paired[name], paired["rest"], strict=True)]
        figures[f"{name}_minus_rest_p50_ms"] = round(statistics.median(differences), 2)
    added = [p - m for p, m in zip(paired["mcp_proxy"], paired["mcp"], strict=True)]
    figures["mcp_proxy_minus_mcp_p50_ms"] = round(statistics.median(added), 2)
    figures["mcp_client_schema_check_p50_ms"] = round(
        client_validation_ms(server, api_key, kb, queries[0]), 2
    )
    bench.results["latency_ms"] = figures
