"""Daily CLI commands against the API: knowledge bases, documents, batches, search, bulk ingest."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from client.bulk import load, summary_table, walk
from client.http import ApiError, Remote, api_path, default_key, default_server, is_local_stack
from shared.config import ConfigError, get_settings

Server = Annotated[
    str | None, typer.Option("--server", help="API URL (default: RAGLINE_SERVER or the local API).")
]
ApiKey = Annotated[
    str | None,
    typer.Option(
        "--api-key", help="API key (default: RAGLINE_API_KEY; for the local stack only, its development key)."
    ),
]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

kb_app = typer.Typer(help="Knowledge bases.", no_args_is_help=True)
doc_app = typer.Typer(help="Documents.", no_args_is_help=True)
batch_app = typer.Typer(help="Batches of uploads.", no_args_is_help=True)
console = Console()


def _remote(server: str | None, api_key: str | None, *, patient: bool = False) -> Remote:
    """A client of `server` (default: RAGLINE_SERVER or the local stack) with the key it may get."""
    try:
        settings = get_settings()
    except ConfigError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None
    url = server or default_server(settings)
    local = is_local_stack(url, settings)
    hint = (
        "; start the local stack with `make up` (for one on another port, set RAGLINE_API__PORT)"
        if local
        else "; check --server or RAGLINE_SERVER"
    )
    key = default_key(settings, url, api_key)
    remote = Remote(url, key, patient=patient, unreachable_hint=hint)
    named = bool(api_key or os.environ.get("RAGLINE_API_KEY"))
    keys = settings.state_dir / "api-keys.json"
    remote.auth_hint = _auth_hint(keys, local, named=named, sent=key is not None)
    return remote


def _auth_hint(keys: Path, local: bool, *, named: bool, sent: bool) -> str:
    """What an AUTH_ERROR adds: where the key the caller did not name came from, or where none was.
    A stack started with another state dir (another checkout's) wrote its key elsewhere."""
    if named:
        return ""
    if sent:
        return (
            f" (sent the development key in {keys}; set RAGLINE_STATE_DIR to the running stack's "
            "state dir, or pass --api-key)"
        )
    if local:
        return (
            f" (no key given, and no development key in {keys}: set RAGLINE_STATE_DIR to the running "
            "stack's state dir, or pass --api-key or set RAGLINE_API_KEY)"
        )
    return " (pass --api-key or set RAGLINE_API_KEY; the local development key goes only to the local stack)"


def _call(remote: Remote, method: str, path: str, **kwargs: Any) -> Any:
    try:
        return remote.request(method, path, **kwargs)
    except ApiError as error:
        typer.echo(_explain(remote, error), err=True)
        raise typer.Exit(1) from None
    finally:
        remote.close()


def _explain(remote: Remote, error: ApiError) -> str:
    """The one line a failed call prints; a refused key says where it came from (`_auth_hint`)."""
    line = f"{error.code}: {error.message}"
    return line + remote.auth_hint if error.code == "AUTH_ERROR" else line


def _confirm(question: str, yes: bool) -> None:
    """Ask before something is deleted; without a terminal to ask on, refuse unless --yes."""
    if yes:
        return
    if not sys.stdin.isatty():
        typer.echo(f"refused: {question} Pass --yes to confirm (no terminal to ask on).", err=True)
        raise typer.Exit(2)
    typer.confirm(question, abort=True)


def _print(
    value: Any, as_json: bool, columns: list[str] | None = None, rows: list[dict[str, Any]] | None = None
) -> None:
    if as_json or columns is None or rows is None:
        typer.echo(json.dumps(value, indent=2))
        return
    table = Table()
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*[_cell(row.get(c)) for c in columns])
    console.print(table)


def _cell(value: Any) -> Text:
    """A value as printed: nothing for none (not `None`), and as written, never read as markup
    (an id like `[red]notes` lost its brackets)."""
    return Text("" if value is None else str(value))


@kb_app.command("create")
def kb_create(
    kb_id: str,
    name: Annotated[str | None, typer.Option(help="Display name (default: the id).")] = None,
    description: str = "",
    pii_policy: Annotated[str | None, typer.Option(help="redact, mask, hash, block, off")] = None,
    model: Annotated[
        str | None, typer.Option(help="Embedding model (default: the server's), e.g. all-MiniLM-L6-v2-int8.")
    ] = None,
    server: Server = None,
    api_key: ApiKey = None,
    as_json: AsJson = False,
) -> None:
    """Create a knowledge base."""
    body: dict[str, Any] = {"kb_id": kb_id, "name": name or kb_id, "description": description}
    if pii_policy:
        body["settings"] = {"pii_policy": pii_policy}
    if model:
        body["embedding_model"] = model
    _print(_call(_remote(server, api_key), "POST", api_path("kbs"), json=body), True)


@kb_app.command("list")
def kb_list(server: Server = None, api_key: ApiKey = None, as_json: AsJson = False) -> None:
    """List knowledge bases with document and chunk counts."""
    kbs = _call(_remote(server, api_key), "GET", api_path("kbs"))["knowledge_bases"]
    # A count of documents alone read as loaded while most of them were still queued.
    rows = [
        kb | {status: kb.get("documents_by_status", {}).get(status, 0) for status in _SHOWN} for kb in kbs
    ]
    _print(kbs, as_json, ["kb_id", "name", "document_count", *_SHOWN, "chunk_count", "description"], rows)


_SHOWN = ("ready", "failed")  # of the documents by status, those a table shows


@kb_app.command("show")
def kb_show(kb_id: str, server: Server = None, api_key: ApiKey = None) -> None:
    """Show one knowledge base."""
    _print(_call(_remote(server, api_key), "GET", api_path("kbs", kb_id)), True)


@kb_app.command("delete")
def kb_delete(
    kb_id: str,
    yes: Yes = False,
    server: Server = None,
    api_key: ApiKey = None,
) -> None:
    """Delete a knowledge base with all its documents and chunks (asks first, unless --yes)."""
    _confirm(f"Delete knowledge base {kb_id!r} and all its documents?", yes)
    _call(_remote(server, api_key), "DELETE", api_path("kbs", kb_id))
    typer.echo(f"deleted {kb_id}")


@kb_app.command("reembed")
def kb_reembed(
    kb_id: str,
    model: Annotated[str, typer.Option("--model", help="Embedding model to move the chunks to.")],
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait until the new index is live.")] = True,
    server: Server = None,
    api_key: ApiKey = None,
) -> None:
    """Re-embed a knowledge base with another model; searches keep answering throughout."""
    view = _call(_remote(server, api_key), "POST", api_path("kbs", kb_id, "reembed"), json={"model": model})
    while wait and view.get("reembed") is not None:
        time.sleep(1.0)
        view = _call(_remote(server, api_key), "GET", api_path("kbs", kb_id))
    _print(view, True)
    if wait and view.get("embedding_model") != model:
        typer.echo(f"reembed failed: {view.get('reembed_error')}", err=True)
        raise typer.Exit(1)


@doc_app.command("status")
def doc_status(
    kb: Annotated[str, typer.Option("--kb")], doc_id: str, server: Server = None, api_key: ApiKey = None
) -> None:
    """A document's status object."""
    _print(_call(_remote(server, api_key), "GET", api_path("kbs", kb, "documents", doc_id)), True)


@doc_app.command("list")
def doc_list(
    kb: Annotated[str, typer.Option("--kb")],
    status: str | None = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    cursor: str | None = None,
    server: Server = None,
    api_key: ApiKey = None,
    as_json: AsJson = False,
) -> None:
    """List documents (one page; pass --cursor for the next)."""
    params: dict[str, Any] = {
        "limit": limit,
        **({"status": status} if status else {}),
        **({"cursor": cursor} if cursor else {}),
    }
    page = _call(_remote(server, api_key), "GET", api_path("kbs", kb, "documents"), params=params)
    _print(page, as_json, ["doc_id", "status", "chunk_count", "updated_at"], page["documents"])
    if not as_json and page["next_cursor"]:
        typer.echo(f"next page: --cursor {page['next_cursor']}")


@doc_app.command("delete")
def doc_delete(
    kb: Annotated[str, typer.Option("--kb")],
    doc_id: str,
    yes: Yes = False,
    server: Server = None,
    api_key: ApiKey = None,
) -> None:
    """Delete a document with its chunks (asks first, unless --yes)."""
    _confirm(f"Delete document {doc_id!r} of knowledge base {kb!r}?", yes)
    _print(_call(_remote(server, api_key), "DELETE", api_path("kbs", kb, "documents", doc_id)), True)


@batch_app.command("status")
def batch_status(batch_id: str, server: Server = None, api_key: ApiKey = None) -> None:
    """Counts per status and failures of a batch."""
    _print(_call(_remote(server, api_key), "GET", api_path("batches", batch_id)), True)


def search(
    query: str,
    kb: Annotated[list[str] | None, typer.Option("--kb", help="Knowledge base (repeatable).")] = None,
    top_k: Annotated[int, typer.Option(min=1, max=100)] = 10,
    mode: Annotated[str, typer.Option(help="hybrid, similarity or keyword")] = "hybrid",
    server: Server = None,
    api_key: ApiKey = None,
    as_json: AsJson = False,
) -> None:
    """Search knowledge bases."""
    body: dict[str, Any] = {"query": query, "top_k": top_k, "mode": mode, **({"kb_ids": kb} if kb else {})}
    result = _call(_remote(server, api_key), "POST", api_path("search"), json=body)
    rows = [
        {**h, "text": " ".join(h["text"].split())[:100], "score": f"{h['score']:.4f}"}
        for h in result["results"]
    ]
    # Pages are a PDF's: a column for them only when a hit has one.
    paged = any(row.get("page_num") is not None for row in rows)
    _print(result, as_json, ["score", "kb_id", "doc_id", *(["page_num"] if paged else []), "text"], rows)


def ingest(
    paths: Annotated[list[Path], typer.Argument(help="Files and folders to load.")],
    kb: Annotated[str, typer.Option("--kb", help="Target knowledge base.")],
    glob: Annotated[str | None, typer.Option("--glob", help="Only files matching this pattern.")] = None,
    recursive: Annotated[bool, typer.Option("--recursive", "-r", help="Descend into folders.")] = False,
    metadata: Annotated[list[str] | None, typer.Option("--metadata", help="k=v, repeatable.")] = None,
    concurrency: Annotated[int, typer.Option(min=1, max=64, help="Parallel uploads.")] = 4,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait until every document is done.")] = True,
    server: Server = None,
    api_key: ApiKey = None,
    as_json: AsJson = False,
) -> None:
    """Bulk-load files through the API; re-running is cheap and completes an interrupted load."""
    pairs: dict[str, str] = {}
    for item in metadata or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"--metadata needs k=v, got {item!r}")
        pairs[key] = value
    try:
        files = list(walk(paths, glob, recursive))
    except FileNotFoundError as error:
        typer.echo(f"NOT_FOUND: no such file or folder: {error}", err=True)
        raise typer.Exit(2) from None
    remote = _remote(server, api_key, patient=True)
    try:
        remote.get(api_path("kbs", kb))
        report = load(
            remote,
            kb,
            files,
            metadata=pairs,
            concurrency=concurrency,
            wait=wait,
            console=Console(stderr=True),
        )
    except ApiError as error:
        typer.echo(_explain(remote, error), err=True)
        raise typer.Exit(1) from None
    finally:
        remote.close()
    if as_json:
        typer.echo(json.dumps(report.as_dict(), indent=2))
    else:
        console.print(summary_table(report))
        for failure in report.failures:
            reason = failure.get("error") or {}
            typer.echo(f"FAILED {failure['doc_id']}: {reason.get('code')}: {reason.get('message')}")
    if report.failures:
        raise typer.Exit(1)
