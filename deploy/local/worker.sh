#!/usr/bin/env bash
# Runs one Celery worker of Ragline in the background.
# Usage: worker.sh start|stop|status [NAME]   (NAME defaults to "worker"; queues from RAGLINE_CELERY__QUEUES)
# Metrics: RAGLINE_METRICS__WORKER_PORT when set; else the default worker serves them on the API port
# + 1000 (so parallel local stacks, each with its own API port, never collide) and others serve none.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

NAME=${2:-worker}
PIDFILE=$STATE_DIR/$NAME.pid
LOG=$LOG_DIR/$NAME.log

# Celery's "<name>@<host> ready." line, as plain text or inside a JSON log line.
ready() { grep -qE ' ready\.("|$)' "$LOG"; }

metrics_port() {
  if [ -n "${RAGLINE_METRICS__WORKER_PORT:-}" ]; then
    echo "$RAGLINE_METRICS__WORKER_PORT"
  elif [ "$NAME" = worker ]; then
    echo $((${RAGLINE_API__PORT:-8000} + 1000))
  else
    echo 0
  fi
}

start() {
  [ -x "$VENV/bin/ragline" ] || die "$VENV/bin/ragline not found; run 'make install' first"
  if pid_running "$PIDFILE"; then
    say "$NAME: already running (pid $(cat "$PIDFILE"))"
    return 0
  fi
  : >"$LOG"
  rm -f "$PIDFILE"
  # Celery writes its own pid file: the pid of `setsid` may be a parent that already exited.
  # Everything, the subshell included, writes to the log: nothing may hold the caller's stdout.
  local port
  port=$(metrics_port)
  (cd "$REPO_ROOT" && RAGLINE_METRICS__WORKER_PORT=$port exec setsid "$VENV/bin/ragline" worker \
    --name "$NAME" --pidfile "$PIDFILE") >>"$LOG" 2>&1 </dev/null &
  wait_until 180 "$NAME" "$LOG" ready
  local metrics="metrics off"
  [ "$port" = 0 ] || metrics="metrics http://127.0.0.1:$port/metrics"
  say "$NAME: ready (pid $(cat "$PIDFILE"), log $LOG, $metrics)"
}

stop() { stop_pidfile "$PIDFILE" "$NAME" 60; }

status() {
  if pid_running "$PIDFILE"; then
    say "$NAME: running (pid $(cat "$PIDFILE"))"
  else
    say "$NAME: stopped"
    return 3
  fi
}

"${1:?usage: worker.sh start|stop|status [NAME]}"
