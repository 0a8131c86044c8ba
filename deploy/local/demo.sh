#!/usr/bin/env bash
# The main job on the local stack: start it, bulk-load a real corpus found on the machine (the
# SQLite documentation from Debian's sqlite3-doc, installed if missing), then search it through MCP.
set -euo pipefail
HERE=$(dirname "${BASH_SOURCE[0]}")
source "$HERE/lib.sh"
KB=${RAGLINE_DEMO_KB:-sqlite-docs}

if ! dpkg-query -W -f='${Status}' sqlite3-doc 2>/dev/null | grep -q "ok installed"; then
  say "demo: installing Debian's sqlite3-doc (the corpus)"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends sqlite3-doc >/dev/null
fi
CORPUS=$(dirname "$(dpkg -L sqlite3-doc | grep -m1 '/lang_select.html$')")
say "demo: corpus $CORPUS ($(find "$CORPUS" -name '*.html' | wc -l) HTML pages)"

bash "$HERE/stack.sh" up
RAGLINE=$VENV/bin/ragline
# A public manual: no personal data to redact. A KB left by an earlier demo is reused; any other
# refusal (a key from another state dir, the API down) stops the demo with the CLI's message.
if ! created=$("$RAGLINE" kb create "$KB" --name "SQLite documentation" \
  --description "The SQLite manual: SQL syntax, C API, pragmas, file format" --pii-policy off 2>&1); then
  grep -q '^CONFLICT:' <<<"$created" || die "demo: could not create the knowledge base: $created"
  say "demo: knowledge base $KB exists; loading into it (unchanged files are skipped)"
fi
# A load that fails some documents still demonstrates the job; the summary lists them.
"$RAGLINE" ingest "$CORPUS" --kb "$KB" --recursive --glob '*.html' --concurrency 4 || true
"$VENV/bin/python" "$HERE/demo_mcp.py" "$KB"
