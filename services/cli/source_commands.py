"""`ragline source`: the sources of a knowledge base, against the API like the other remote commands."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer

from client.http import api_path
from services.cli.remote_commands import ApiKey, AsJson, Server, Yes, _call, _confirm, _print, _remote

source_app = typer.Typer(
    help="Sources that keep a knowledge base in sync (folder, s3, web, git).", no_args_is_help=True
)

ENDED = ("succeeded", "completed_with_errors", "failed", "cancelled")
COLUMNS = ["source_id", "type", "name", "schedule", "last run", "next_run_at"]


def _settings(
    kind: str,
    path: str | None,
    url: str | None,
    bucket: str | None,
    prefix: str | None,
    endpoint_url: str | None,
    ref: str | None,
    include: list[str] | None,
    exclude: list[str] | None,
) -> dict[str, Any]:
    given: dict[str, Any] = {
        "folder": {"path": path},
        "web": {"url": url, "prefix": prefix},
        "s3": {"bucket": bucket, "prefix": prefix, "endpoint_url": endpoint_url},
        "git": {"url": url or path, "ref": ref},
    }.get(kind, {})
    if include:
        given["include"] = include
    if exclude:
        given["exclude"] = exclude
    return {k: v for k, v in given.items() if v is not None}


@source_app.command("add")
def source_add(
    kb_id: str,
    kind: Annotated[str, typer.Option("--type", help="folder, s3, web or git.")],
    source_id: Annotated[str | None, typer.Option("--id", help="Default: generated.")] = None,
    name: str = "",
    path: Annotated[
        str | None, typer.Option(help="folder: the directory (on the workers); git: a repository path.")
    ] = None,
    url: Annotated[str | None, typer.Option(help="web: start page or sitemap; git: repository URL.")] = None,
    bucket: Annotated[str | None, typer.Option(help="s3: the bucket.")] = None,
    prefix: Annotated[str | None, typer.Option(help="s3: key prefix; web: URL prefix to stay under.")] = None,
    endpoint_url: Annotated[str | None, typer.Option(help="s3: an S3-compatible server.")] = None,
    ref: Annotated[str | None, typer.Option(help="git: branch, tag or commit.")] = None,
    include: Annotated[list[str] | None, typer.Option(help="Globs of what to take (repeatable).")] = None,
    exclude: Annotated[list[str] | None, typer.Option(help="Globs of what to leave (repeatable).")] = None,
    every: Annotated[int | None, typer.Option(help="Sync by itself every this many seconds (>= 60).")] = None,
    doc_id_prefix: Annotated[str, typer.Option(help="Put before each document id, e.g. 'wiki/'.")] = "",
    max_deleted_share: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="A run deleting more of its documents fails (1: never).")
    ] = 0.5,
    settings_json: Annotated[
        str | None, typer.Option("--settings", help="The type's settings as JSON (instead of the options).")
    ] = None,
    server: Server = None,
    api_key: ApiKey = None,
) -> None:
    """Add a source to a knowledge base (then `ragline source sync`, or give --every)."""
    settings = (
        json.loads(settings_json)
        if settings_json
        else _settings(kind, path, url, bucket, prefix, endpoint_url, ref, include, exclude)
    )
    body: dict[str, Any] = {
        "type": kind,
        "name": name,
        "settings": settings,
        "doc_id_prefix": doc_id_prefix,
        "max_deleted_share": max_deleted_share,
    }
    if source_id:
        body["source_id"] = source_id
    if every is not None:
        body["schedule"] = {"interval_s": every}
    _print(_call(_remote(server, api_key), "POST", api_path("kbs", kb_id, "sources"), json=body), True)


@source_app.command("list")
def source_list(kb_id: str, server: Server = None, api_key: ApiKey = None, as_json: AsJson = False) -> None:
    """List a knowledge base's sources and how their last run ended."""
    sources = _call(_remote(server, api_key), "GET", api_path("kbs", kb_id, "sources"))["sources"]
    rows = [
        {
            **s,
            "schedule": f"every {s['schedule']['interval_s']} s" if s["schedule"] else "",
            "last run": _run_line(s["active_run"] or s["last_run"])
            if (s["active_run"] or s["last_run"])
            else "",
        }
        for s in sources
    ]
    _print(sources, as_json, COLUMNS, rows)


@source_app.command("show")
def source_show(kb_id: str, source_id: str, server: Server = None, api_key: ApiKey = None) -> None:
    """Show a source, its settings (secrets hidden) and its last run."""
    _print(_call(_remote(server, api_key), "GET", api_path("kbs", kb_id, "sources", source_id)), True)


@source_app.command("runs")
def source_runs(
    kb_id: str, source_id: str, server: Server = None, api_key: ApiKey = None, as_json: AsJson = False
) -> None:
    """A source's recent runs, newest first."""
    runs = _call(_remote(server, api_key), "GET", api_path("kbs", kb_id, "sources", source_id, "runs"))[
        "runs"
    ]
    rows = [{**r, "summary": _run_line(r)} for r in runs]
    _print(runs, as_json, ["run_id", "trigger", "summary", "created_at"], rows)


@source_app.command("sync")
def source_sync(
    kb_id: str,
    source_id: str,
    wait: Annotated[bool, typer.Option(help="Wait for the run to end and print its counts.")] = True,
    allow_deletions: Annotated[
        bool, typer.Option(help="Delete past the source's max_deleted_share, this run only.")
    ] = False,
    retry_failed: Annotated[
        bool, typer.Option(help="Ingest again the documents the pipeline failed, their bytes unchanged.")
    ] = False,
    documents: Annotated[
        bool,
        typer.Option(
            help="After the run, wait until the documents it sent are ready or failed and list those "
            "failed (--no-documents: end with the run)."
        ),
    ] = True,
    server: Server = None,
    api_key: ApiKey = None,
    as_json: AsJson = False,
) -> None:
    """Run a source now (or join its run under way); exits 1 if the run fails or an item failed,
    in the run or in the pipeline (unless --no-documents)."""
    path = api_path("kbs", kb_id, "sources", source_id, "sync")
    params = {
        name: "true"
        for name, on in (("allow_deletions", allow_deletions), ("retry_failed", retry_failed))
        if on
    }
    run = _call(_remote(server, api_key), "POST", path, params=params)
    if wait:
        run = _follow(server, api_key, kb_id, source_id, run, as_json)
        if documents and _sent(run):
            run = {**run, "documents": _follow_batch(server, api_key, run["run_id"], as_json)}
    _finish(run, as_json)


def _sent(run: dict[str, Any]) -> int:
    counts = run.get("counts") or {}
    return int(counts.get("created", 0)) + int(counts.get("updated", 0))


def _follow_batch(server: str | None, api_key: str | None, batch_id: str, quiet: bool) -> dict[str, Any]:
    """Poll the run's batch (the documents it sent) until each is ready or failed."""
    last = ""
    while True:
        batch = _call(_remote(server, api_key), "GET", api_path("batches", batch_id))
        if batch["done"]:
            return dict(batch)
        line = _documents_line(batch)
        if line != last and not quiet:
            typer.echo(line, err=True)
            last = line
        time.sleep(1)


@source_app.command("update")
def source_update(
    kb_id: str,
    source_id: str,
    name: Annotated[str | None, typer.Option(help="A new name.")] = None,
    every: Annotated[int | None, typer.Option(help="Sync by itself every this many seconds (>= 60).")] = None,
    no_schedule: Annotated[bool, typer.Option("--no-schedule", help="Sync only when asked.")] = False,
    max_deleted_share: Annotated[
        float | None,
        typer.Option(min=0.0, max=1.0, help="A run deleting more of its documents fails (1: never)."),
    ] = None,
    server: Server = None,
    api_key: ApiKey = None,
) -> None:
    """Change a source's name, schedule or deletion guard; what it reads stays."""
    if every is not None and no_schedule:
        typer.echo("give --every or --no-schedule, not both", err=True)
        raise typer.Exit(2)
    body: dict[str, Any] = {}
    if name is not None:
        body["name"] = name
    if every is not None or no_schedule:
        body["schedule"] = {"interval_s": every} if every is not None else None
    if max_deleted_share is not None:
        body["max_deleted_share"] = max_deleted_share
    if not body:
        typer.echo("nothing to change: give --name, --every, --no-schedule or --max-deleted-share", err=True)
        raise typer.Exit(2)
    path = api_path("kbs", kb_id, "sources", source_id)
    _print(_call(_remote(server, api_key), "PATCH", path, json=body), True)


@source_app.command("remove")
def source_remove(
    kb_id: str,
    source_id: str,
    keep_documents: Annotated[bool, typer.Option(help="Keep the documents it brought.")] = False,
    yes: Yes = False,
    server: Server = None,
    api_key: ApiKey = None,
) -> None:
    """Remove a source and (unless --keep-documents) every document it brought."""
    what = "and keep its documents" if keep_documents else "and delete every document it brought"
    _confirm(f"Remove source '{source_id}' of '{kb_id}' {what}?", yes)
    params = {"keep_documents": "true"} if keep_documents else None
    path = api_path("kbs", kb_id, "sources", source_id)
    run = _call(_remote(server, api_key), "DELETE", path, params=params)
    if run:
        run = _follow(server, api_key, kb_id, source_id, run, False, removal=True)
    typer.echo(f"removed source '{source_id}'")


def _follow(
    server: str | None,
    api_key: str | None,
    kb_id: str,
    source_id: str,
    run: dict[str, Any],
    quiet: bool,
    *,
    removal: bool = False,
) -> dict[str, Any]:
    """Poll the run until it ends, printing a line whenever its progress changes."""
    last = ""
    while run["status"] not in ENDED:
        time.sleep(1)
        path = api_path("kbs", kb_id, "sources", source_id, "runs", run["run_id"])
        remote = _remote(server, api_key)
        try:
            run = remote.get(path)
        except Exception:
            if removal:
                return {**run, "status": "succeeded"}
            raise
        finally:
            remote.close()
        line = _run_line(run)
        # The last state is the result's line (`_finish`), on stdout: not twice.
        if line != last and not quiet and run["status"] not in ENDED:
            typer.echo(line, err=True)
            last = line
    return run


def _run_line(run: dict[str, Any]) -> str:
    counts = run.get("counts") or {}
    shown = ", ".join(f"{k} {v}" for k, v in counts.items() if v)
    duration = f" in {run['duration_s']} s" if run.get("duration_s") is not None else ""
    error = f" ({run['error']['code']}: {run['error']['message']})" if run.get("error") else ""
    status = str(run["status"]).replace("_", " ")
    return f"{status}: listed {run.get('listed', 0)}{'; ' + shown if shown else ''}{duration}{error}"


def _documents_line(batch: dict[str, Any]) -> str:
    return "documents: " + ", ".join(f"{k} {v}" for k, v in sorted(batch["counts"].items()))


def _finish(run: dict[str, Any], as_json: bool) -> None:
    failed_documents = (run.get("documents") or {}).get("failures") or []
    if as_json:
        typer.echo(json.dumps(run, indent=2))
    else:
        typer.echo(_run_line(run))
        for failure in run.get("failures") or []:
            typer.echo(f"  {failure['key']}: {failure['code']}: {failure['message']}")
        if run.get("documents"):
            typer.echo(_documents_line(run["documents"]))
        for failure in failed_documents:
            error = failure.get("error") or {}
            typer.echo(f"  {failure['doc_id']}: {error.get('code')}: {error.get('message')}")
    if run["status"] == "failed" or run.get("failures") or failed_documents:
        raise typer.Exit(1)
