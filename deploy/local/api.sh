#!/usr/bin/env bash
# Runs the Ragline API (REST under /v1, MCP at /mcp) on 127.0.0.1 in the background.
# Without configured keys it creates a local development key on first run (state dir, git-ignored).
# Usage: api.sh start|stop|status
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PORT=${RAGLINE_API__PORT:-8000}
PIDFILE=$STATE_DIR/api.pid
LOG=$LOG_DIR/api.log
KEYS=$STATE_DIR/api-keys.json
URL=http://127.0.0.1:$PORT
# The API's command line, or this script's own subshell before it execs the API. Any port: `stop`
# without the RAGLINE_API__PORT that `start` had still stops the API its pid file names.
PID_MATCH="ragline serve --host 127\.0\.0\.1 --port [0-9]+( |\$)|(^|[ /])api\.sh start\$"
# Every stack's API has that command line: this one's also runs with this state dir.
PID_OWN_STATE=yes

dev_key() {
  if [ ! -s "$KEYS" ]; then
    local key
    key="rl_dev_$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    (umask 077 && printf '[{"key": "%s", "tenant": "%s", "role": "admin", "name": "local development"}]\n' \
      "$key" "${RAGLINE_TENANT:-default}" >"$KEYS")
    say "api: created a local development API key (admin, tenant ${RAGLINE_TENANT:-default}) in $KEYS"
  fi
  local found
  found=$(named_key "$KEYS" "local development" 2>/dev/null) || found=""
  if [ -n "$found" ]; then
    say "api: development key: $found"
  else
    say "api: $KEYS holds no key named 'local development'; use one of its keys"
  fi
}

# named_key FILE NAME: the key of the entry called NAME in a keys file (JSON parsed, not grepped:
# the file may hold several keys of several tenants, on one line or many).
named_key() {
  "$VENV/bin/python" - "$1" "$2" <<'PY'
import json, sys
entries = json.load(open(sys.argv[1]))
print(next((e["key"] for e in entries if e.get("name") == sys.argv[2] and not e.get("revoked")), ""))
PY
}

healthy() { curl -sf --max-time 2 "$URL/healthz" >/dev/null; }

# listens_here PID: the API answering is PID's, the one this start launched: a server that took the
# port between the check in `start` and this one's bind would answer while this one exits.
listens_here() {
  healthy && "$VENV/bin/python" - "$1" "$PORT" <<'PY'
import sys

import psutil

pid, port = sys.argv[1], int(sys.argv[2])
try:
    sockets = psutil.Process(int(pid)).net_connections("tcp") if pid else []
except psutil.Error:
    sockets = []
sys.exit(0 if any(s.status == psutil.CONN_LISTEN and s.laddr.port == port for s in sockets) else 1)
PY
}

# One start or stop at a time (serialise): two starts at once both launched an API, and the pid
# file named one of them (or one that had died).
start() {
  require_ragline
  serialise api
  if pid_running "$PIDFILE"; then
    say "api: already running on $URL (pid $(cat "$PIDFILE"))"
    if [ -z "${RAGLINE_AUTH__API_KEYS:-}${RAGLINE_AUTH__KEYS_FILE:-}${RAGLINE_AUTH__ALLOW_ANONYMOUS:-}" ]; then
      dev_key # the key again: the run that printed it may be far up a terminal, or in another
    fi
    return 0
  fi
  # Another server answering there would pass the health check for this one, which cannot bind.
  healthy && die "api: $URL already answers, not as this state dir's API; stop it or set RAGLINE_API__PORT"
  if [ -z "${RAGLINE_AUTH__API_KEYS:-}${RAGLINE_AUTH__KEYS_FILE:-}${RAGLINE_AUTH__ALLOW_ANONYMOUS:-}" ]; then
    dev_key
    export RAGLINE_AUTH__KEYS_FILE=$KEYS
  fi
  fresh_log "$LOG"
  (cd "$REPO_ROOT" && exec setsid "$VENV/bin/ragline" serve --host 127.0.0.1 --port "$PORT") \
    >>"$LOG" 2>&1 </dev/null 9>&- &
  local launched=$!
  echo "$launched" >"$PIDFILE"
  if ! wait_until --pid "$launched" 120 api "$LOG" listens_here "$launched"; then
    stop_launched "$launched" # not left running for the next start to call "already running"
    rm -f "$PIDFILE"
    exit 1
  fi
  say "api: listening on $URL (REST /v1, OpenAPI $URL/docs, MCP $URL/mcp; log $LOG)"
}

stop() {
  serialise api
  stop_pidfile "$PIDFILE" api 20
}

status() {
  if pid_running "$PIDFILE" && healthy; then
    say "api: running on $URL"
  else
    say "api: stopped"
    return 3
  fi
}

"${1:?usage: api.sh start|stop|status}" "${@:2}"
