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
"$RAGLINE" kb create "$KB" --name "SQLite documentation" \
  --description "The SQLite manual: SQL syntax, C API, pragmas, file format" \
  --pii-policy off >/dev/null 2>&1 || true  # a public manual: no personal data to redact
# A load that fails some documents still demonstrates the job; the summary lists them.
"$RAGLINE" ingest "$CORPUS" --kb "$KB" --recursive --glob '*.html' --concurrency 4 || true
"$VENV/bin/python" "$HERE/demo_mcp.py" "$KB"
