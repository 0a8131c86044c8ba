"""The benchmark's corpus: manbench, built from Debian's man pages by the team's eval script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from shared.config import REPO_ROOT

EVAL_SCRIPT = REPO_ROOT.parent / "shared" / "eval" / "build_manbench.py"
CORPUS_QUICK = 60  # pages of a quick run: every phase, under 5 minutes on 2 cores


def manbench(cache: Path) -> tuple[list[dict[str, str]], dict[str, str], dict[str, set[str]]]:
    """Corpus, queries and qrels, built once from Debian's man pages with the team's eval script."""
    out = cache / "manbench"
    if not (out / "qrels.tsv").is_file():
        if not EVAL_SCRIPT.is_file():
            raise SystemExit(f"the benchmark builder is missing: {EVAL_SCRIPT}")
        missing = [
            p
            for p in ("manpages", "manpages-dev", "groff-base")
            if subprocess.run(["dpkg", "-s", p], capture_output=True, check=False).returncode
        ]
        if missing:
            subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, capture_output=True)
        subprocess.run([sys.executable, str(EVAL_SCRIPT), str(out)], check=True)
    corpus = [json.loads(line) for line in (out / "corpus.jsonl").read_text().splitlines()]
    queries = {q["_id"]: q["text"] for q in map(json.loads, (out / "queries.jsonl").read_text().splitlines())}
    qrels: dict[str, set[str]] = {}
    for line in (out / "qrels.tsv").read_text().splitlines()[1:]:
        qid, doc, _ = line.split("\t")
        qrels.setdefault(qid, set()).add(doc)
    return corpus, queries, qrels


def write_corpus(docs: list[dict[str, str]], folder: Path) -> list[tuple[Path, str]]:
    """One text file per page (title, blank line, text), named by its id."""
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for doc in docs:
        path = folder / f"{doc['_id']}.txt"
        path.write_text(f"{doc['title']}\n\n{doc['text']}\n")
        files.append((path, doc["_id"]))
    return files
