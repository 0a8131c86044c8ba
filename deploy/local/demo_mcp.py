"""Searches the demo knowledge base the way an agent does: over MCP (streamable HTTP) with the SDK client."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

from client.http import default_key, default_server
from shared.config import get_settings

QUESTIONS = [
    "How do I make a column auto-increment?",
    "sqlite3_prepare_v2",
    "Which pragma turns on write-ahead logging?",
]


async def main(kb: str) -> None:
    settings = get_settings()
    url = f"{os.environ.get('RAGLINE_SERVER') or default_server(settings)}/mcp"
    headers = {"Authorization": f"Bearer {default_key(settings)}"}
    async with (
        streamablehttp_client(url, headers=headers) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        kbs: Any = (await session.call_tool("list_knowledge_bases", {})).structuredContent
        for entry in kbs["knowledge_bases"]:
            counts = f"{entry['document_count']} documents, {entry['chunk_count']} chunks"
            print(f"knowledge base {entry['kb_id']}: {counts}")
        for question in QUESTIONS:
            result = await session.call_tool("search", {"query": question, "kb_ids": [kb], "top_k": 3})
            body: Any = result.structuredContent
            print(f"\nQ: {question}   ({body['latency_ms']:.0f} ms)")
            for hit in body["results"]:
                text = " ".join(hit["text"].split())[:140]
                where = " › ".join(hit.get("headings", [])[-2:])
                print(f"  {hit['score']:.4f}  {hit['doc_id']}  [{where}]\n          {text}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "sqlite-docs"))
