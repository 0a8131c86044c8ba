"""The `ragline` command."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from enum import StrEnum
from typing import Annotated

import typer

from services.cli import remote_commands, source_commands
from shared.config import REPO_ROOT, ConfigError, Settings, get_settings

app = typer.Typer(
    name="ragline",
    help="Ragline: ingestion and hybrid retrieval for AI agents.",
    no_args_is_help=True,
    add_completion=False,
)

# What the server commands import beyond a client install: the `server` extra's (pyproject.toml).
SERVER_MODULES = ("celery", "opensearchpy", "fastapi", "sentence_transformers")
STACK_SCRIPT = REPO_ROOT / "deploy" / "local" / "stack.sh"
Services = Annotated[
    list[str] | None,
    typer.Argument(help="Services to act on (opensearch, redis, s3, worker, api); default: all."),
]


def _settings() -> Settings:
    try:
        return get_settings()
    except ConfigError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None


def _needs_server(command: str) -> None:
    """Stop with a clear message where a client install (no `server` extra) runs a server command."""
    missing = [m for m in SERVER_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        typer.echo(
            f"INVALID_ARGUMENT: `ragline {command}` runs the server, which this install lacks "
            f"({', '.join(missing)}); install ragline[server]",
            err=True,
        )
        raise typer.Exit(2)


def _run_stack(command: str, services: list[str] | None) -> None:
    if not STACK_SCRIPT.is_file():
        typer.echo(f"local stack scripts not found at {STACK_SCRIPT}; run from a source checkout", err=True)
        raise typer.Exit(2)
    result = subprocess.run(["bash", str(STACK_SCRIPT), command, *(services or [])], check=False)
    raise typer.Exit(result.returncode)


@app.command()
def up(services: Services = None) -> None:
    """Start the local stack on 127.0.0.1 and wait until each service is healthy."""
    _settings()
    _run_stack("up", services)


@app.command()
def down(services: Services = None) -> None:
    """Stop the local stack; no process is left behind."""
    _run_stack("down", services)


@app.command()
def status(services: Services = None) -> None:
    """Report whether each local service runs and where it listens."""
    _run_stack("status", services)


@app.command()
def worker(
    name: Annotated[str, typer.Option(help="Node name prefix of this worker.")] = "worker",
    queues: Annotated[
        str | None, typer.Option(help="Comma-separated queues, highest priority first (default: all).")
    ] = None,
    concurrency: Annotated[int | None, typer.Option(min=1, help="Worker processes.")] = None,
    loglevel: Annotated[str | None, typer.Option(help="Log level (default: RAGLINE_LOG_LEVEL).")] = None,
    pidfile: Annotated[str | None, typer.Option(help="Write the worker's pid to this file.")] = None,
) -> None:
    """Run a Celery worker of the ingestion pipeline in the foreground."""
    _needs_server("worker")
    from shared.queue import all_queues

    settings = _settings()
    known = all_queues(settings)
    served = queues.split(",") if queues else known
    unknown = sorted(set(served) - set(known))
    if unknown:
        typer.echo(f"unknown queue(s) {', '.join(unknown)}; configured: {', '.join(known)}", err=True)
        raise typer.Exit(2)
    # Exec Celery on the worker app by name: services never import worker code.
    argv = [
        sys.executable,
        "-m",
        "celery",
        "--app=workers.celery_app:app",
        "worker",
        f"--hostname={name}@%h",
        f"--queues={','.join(served)}",
        f"--concurrency={concurrency or settings.celery.worker_concurrency}",
        f"--loglevel={loglevel or settings.log_level}",
        "--without-gossip",
        "--without-mingle",
    ]
    if pidfile:  # Celery expands %h, %n, %p and the like in it: a '%' of the path stays one
        argv.append(f"--pidfile={pidfile.replace('%', '%%')}")
    # Pool processes write their metrics to files here for the main process to serve (see
    # workers/metrics.py); set before Celery imports prometheus_client, emptied so counts restart.
    metrics_dir = settings.state_dir / "metrics" / name
    shutil.rmtree(metrics_dir, ignore_errors=True)
    metrics_dir.mkdir(parents=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    os.chdir(REPO_ROOT)
    os.execv(sys.executable, argv)  # noqa: S606  (replace this process: pid files stay valid)


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default: RAGLINE_API__HOST).")] = None,
    port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="Port (default: RAGLINE_API__PORT).")
    ] = None,
) -> None:
    """Run the REST API (and MCP at /mcp) with uvicorn."""
    _needs_server("serve")
    from services.api.app import create_app
    from services.core import http_server
    from shared import logs, tracing

    settings = _settings()
    logs.configure("api", settings.log_level, settings.log_format, logs.secret_values(settings))
    try:
        tracing.setup(settings, "api")
        api = create_app(settings)
    except ConfigError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None
    http_server.run(api, settings, host or settings.api.host, port or settings.api.port)


class McpTransport(StrEnum):
    STDIO = "stdio"
    SSE = "sse"
    STREAMABLE_HTTP = "streamable-http"


@app.command()
def mcp(
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            help="Serve a remote Ragline's tools instead (its URL; the key from RAGLINE_API_KEY).",
        ),
    ] = None,
    transport: Annotated[
        McpTransport,
        typer.Option(help="stdio for a desktop client; sse or streamable-http to serve over HTTP."),
    ] = McpTransport.STDIO,
    host: Annotated[str | None, typer.Option(help="HTTP bind address (default: RAGLINE_MCP__HOST).")] = None,
    port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="HTTP port (default: RAGLINE_MCP__PORT).")
    ] = None,
) -> None:
    """Run the MCP server: over stdio as the configured tenant (RAGLINE_TENANT); over HTTP
    (--transport sse|streamable-http) with the API's keys; or with --server a stdio proxy to a
    remote Ragline, which needs only the client install."""
    if server is not None:
        if transport != McpTransport.STDIO:
            typer.echo("INVALID_ARGUMENT: --server proxies over stdio only", err=True)
            raise typer.Exit(2)
        from client.mcp_proxy import serve_proxy

        serve_proxy(server, os.environ.get("RAGLINE_API_KEY") or None)
        return
    _needs_server("mcp")
    settings = _settings()
    if transport == McpTransport.STDIO:
        from services.mcp.stdio import serve_stdio

        serve_stdio(settings)
        return
    from services.mcp.http import Transport
    from services.mcp.standalone import serve_http

    try:
        served: Transport = "sse" if transport == McpTransport.SSE else "streamable-http"
        serve_http(settings, served, host or settings.mcp.host, port or settings.mcp.port)
    except ConfigError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None


@app.command("config")
def show_config() -> None:
    """Print the effective configuration as JSON (secrets hidden)."""
    settings = _settings()
    typer.echo(json.dumps(settings.model_dump(mode="json"), indent=2))


app.add_typer(remote_commands.kb_app, name="kb")
app.add_typer(remote_commands.doc_app, name="doc")
app.add_typer(remote_commands.batch_app, name="batch")
app.add_typer(source_commands.source_app, name="source")
app.command()(remote_commands.search)
app.command()(remote_commands.ingest)


def main() -> None:
    """Entry point of the console script."""
    # Nothing Ragline runs may reach a model hub or phone home.
    for name, value in {
        "HF_HUB_OFFLINE": "1",
        "DO_NOT_TRACK": "1",
        "ORT_DISABLE_TELEMETRY": "1",
        "TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS": "",
        # unstructured logs an advertisement at WARNING on every parse otherwise.
        "UNSTRUCTURED_DISABLE_NOTICE": "1",
    }.items():
        os.environ.setdefault(name, value)
    app()


if __name__ == "__main__":
    main()
