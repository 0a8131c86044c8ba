#!/usr/bin/env bash
# Runs one Celery worker of Ragline in the background.
# Usage: worker.sh start|stop|status [NAME]   (NAME defaults to "worker"; queues from RAGLINE_CELERY__QUEUES)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

NAME=${2:-worker}
PIDFILE=$STATE_DIR/$NAME.pid
LOG=$LOG_DIR/$NAME.log

ready() { grep -q "ready\.$" "$LOG"; }

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
  (cd "$REPO_ROOT" && exec setsid "$VENV/bin/ragline" worker --name "$NAME" --pidfile "$PIDFILE") \
    >>"$LOG" 2>&1 </dev/null &
  wait_until 180 "$NAME" "$LOG" ready
  say "$NAME: ready (pid $(cat "$PIDFILE"), log $LOG)"
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
