"""`python -m bench [--quick]`: ingest throughput, query latency, retrieval quality and memory
against their baselines, on the running local stack (`make bench` starts it first)."""

from __future__ import annotations

import argparse
import sys

from bench.run import main, only_ingest, only_sources
from client.http import default_key, default_server
from shared.config import ConfigError, get_settings


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="60 pages, fewer queries.")
    parser.add_argument(
        "--only",
        choices=["ingest", "sources"],
        help="Run this phase alone (ingest: the whole-corpus load and its CPU a chunk per service; "
        "sources: the unchanged re-sync of each source type).",
    )
    args = parser.parse_args(argv)
    try:
        settings = get_settings()
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    key = default_key(settings)
    if key is None:
        print("AUTH_ERROR: no API key; set RAGLINE_API_KEY or run `make up`", file=sys.stderr)
        return 2
    if args.only == "ingest":
        only_ingest(settings, default_server(settings), key, args.quick)
    elif args.only == "sources":
        only_sources(settings, default_server(settings), key, args.quick)
    else:
        main(settings, default_server(settings), key, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(run())
