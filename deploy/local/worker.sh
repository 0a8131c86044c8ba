#!/usr/bin/env bash
# Runs Celery workers of Ragline in the background, each with its own pid file and log.
# Usage: worker.sh start|stop|status [NAME]
#   Without NAME: every worker of RAGLINE_WORKERS, else one named "worker" on every queue
#   (stop also stops any other worker*.pid of the state dir, left from an earlier configuration).
# RAGLINE_WORKERS: named workers and their queues, "NAME=QUEUE,QUEUE NAME=QUEUE" (names start with
#   "worker"); a worker not named there serves every queue. E.g. parse-heavy and embed-heavy workers:
#   RAGLINE_CELERY__STAGE_QUEUES='{"embed":"{queue}-embed","store":"{queue}-embed"}'
#   RAGLINE_WORKERS="worker-parse=interactive,bulk worker-embed=interactive-embed,bulk-embed"
# Metrics: RAGLINE_METRICS__WORKER_PORT when set; else the default worker serves them on the API port
# + 1000 (so parallel local stacks, each with its own API port, never collide) and others serve none.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# RAGLINE_WORKERS as NAME=QUEUES lines
worker_specs() { tr -s ' ' '\n' <<<"${RAGLINE_WORKERS:-}" | grep -v '^$' || true; }

select_worker() { # NAME
  NAME=$1
  [[ $NAME =~ ^worker[A-Za-z0-9_-]*$ ]] || die "worker name '$NAME' must start with 'worker' (then letters, digits, _ or -)"
  PIDFILE=$STATE_DIR/$NAME.pid
  # Celery's command line names its pid file: a stale file naming another program is not the worker.
  # Celery's has its '%' signs doubled (`ragline worker` escapes them from Celery's expansion).
  PID_MATCH="--pidfile( $(literal "$PIDFILE")|=$(literal "${PIDFILE//%/%%}"))( |\$)"
  LOG=$LOG_DIR/$NAME.log
  QUEUES=$(worker_specs | sed -n "s/^$NAME=//p" | head -n1)
}

# Celery's "<name>@<host> ready." line, as plain text or inside a JSON log line.
ready() { grep -qE ' ready\.("|$)' "$LOG"; }
# A pool process has loaded its models (or given up loading them ahead: they load on first use).
warmed() { grep -qE 'pool process warmed up|warm-up incomplete' "$LOG"; }
WARM_UP_WAIT_S=180

metrics_port() {
  if [ -n "${RAGLINE_METRICS__WORKER_PORT:-}" ]; then
    echo "$RAGLINE_METRICS__WORKER_PORT"
  elif [ "$NAME" = worker ]; then
    echo $((${RAGLINE_API__PORT:-8000} + 1000))
  else
    echo 0
  fi
}

# One start or stop of a worker at a time (serialise): two starts at once both launched a worker
# for one pid file. A start holds the lock until the worker is ready (the broker's check, Celery's
# start and the stop of a failed one: about 360 s at most), not while its models load: a second
# start meanwhile finds it running.
LOCK_WAIT_S=400
start() {
  require_ragline
  serialise "$NAME" "$LOCK_WAIT_S"
  if pid_running "$PIDFILE"; then
    say "$NAME: already running (pid $(cat "$PIDFILE"))"
    return 0
  fi
  check_broker
  fresh_log "$LOG"
  rm -f "$PIDFILE"
  # Celery writes its own pid file: the pid of `setsid` may be a parent that already exited.
  # Everything, the subshell included, writes to the log: nothing may hold the caller's stdout.
  local port
  port=$(metrics_port)
  (cd "$REPO_ROOT" && RAGLINE_METRICS__WORKER_PORT=$port exec setsid "$VENV/bin/ragline" worker \
    --name "$NAME" --pidfile "$PIDFILE" ${QUEUES:+--queues "$QUEUES"}) >>"$LOG" 2>&1 </dev/null 9>&- &
  LAUNCHED=$! LEADS=""
  if ! await_worker 180 ready "starting"; then
    tail -n 40 "$LOG" >&2 2>/dev/null || true
    abandon
    die "$NAME did not become healthy within 180s; see $LOG"
  fi
  local metrics="metrics off"
  [ "$port" = 0 ] || metrics="metrics http://127.0.0.1:$port/metrics"
  say "$NAME: started (pid $(cat "$PIDFILE"), log $LOG, $metrics${QUEUES:+, queues $QUEUES})"
  exec 9>&-
  # Its pool processes load the models before their first task: documents sent meanwhile showed
  # `queued` for half a minute, which read as stuck. So `up` returns once one of them is warm.
  say "$NAME: loading the models"
  if await_worker "$WARM_UP_WAIT_S" warmed "loading the models"; then
    say "$NAME: ready to take documents"
  else
    say "$NAME: still loading the models after ${WARM_UP_WAIT_S}s; documents wait as queued until \"pool process warmed up\" in $LOG"
  fi
}

# Whether the worker's process is gone: its pid file names a dead process, or, before Celery
# writes it, the process started here has ended (a configuration refused, an import failed) and no
# process runs its command line. That process becomes Celery (setsid and `ragline worker` exec);
# the command line is only asked where setsid forked, in a shell with job control: read alone, it
# took a starting worker for gone now and then, which failed a start (and CI) with the worker up.
# Once the process started here was seen to lead its own session, setsid did not fork: its end is
# the worker's, and a process of the same command line is another run's.
gone() {
  if [ -s "$PIDFILE" ]; then
    ! pid_running "$PIDFILE"
  elif alive "$LAUNCHED"; then
    [ -n "$LEADS" ] || [ "$(ps -o sid= -p "$LAUNCHED" 2>/dev/null | tr -d ' ')" != "$LAUNCHED" ] || LEADS=1
    return 1
  elif [ -n "$LEADS" ]; then
    return 0
  else
    ! pgrep -f -- "$PID_MATCH" >/dev/null # before and after it execs Celery
  fi
}

# A start that failed stops what it launched: a worker left running (retrying a broker it cannot
# reach) read as running to `status` and to the next `up`, which then kept its old settings.
# Before Celery wrote its pid file, `stop` could not find it.
abandon() {
  if [ -s "$PIDFILE" ]; then
    halt || true
  else
    stop_launched "$LAUNCHED"
    [ -n "$LEADS" ] || pkill -KILL -f -- "$PID_MATCH" 2>/dev/null || true # where setsid forked
  fi
}

# A start fails at once where the broker does not answer a ping within RAGLINE_REDIS__TIMEOUT_S
# (and the whole check within 120 s), naming it (its password masked, as Celery logs it) and why:
# one that accepts connections but never answers logged no refusal, and the start waited out its
# 180 s, then blamed the worker. Settings the worker refuses are left to its own start, which
# names them.
check_broker() {
  local why rc=0
  why=$(cd "$REPO_ROOT" && timeout 120 "$VENV/bin/python" - 2>/dev/null <<'PY'
import sys

from kombu.utils.url import maybe_sanitize_url

from shared.config import get_settings
from shared.queue import redis_client

settings = get_settings()
try:
    redis_client(settings).ping()
except Exception as exc:  # any failure to answer is the broker's
    print(f"{maybe_sanitize_url(settings.redis.url)}: {exc}")
    sys.exit(3)
PY
  ) || rc=$?
  case $rc in
    3) ;;
    124) why="no answer within 120s" ;;
    *) return 0 ;;
  esac
  die "$NAME cannot reach its broker ($why); is Redis running (redis.sh start), and RAGLINE_REDIS__URL right?"
}

# await_worker SECONDS CHECK DOING: 0 once CHECK passes, 1 after SECONDS; fails the start at once
# when the worker exits meanwhile.
await_worker() {
  local seconds=$1 check=$2 doing=$3 i
  for ((i = 0; i < seconds * 2; i++)); do
    "$check" && return 0
    # From its second poll on: the background shell may not have become the worker yet.
    if ((i > 1)) && gone; then
      tail -n 40 "$LOG" >&2 2>/dev/null || true
      die "$NAME exited while $doing; see $LOG"
    fi
    sleep 0.5
  done
  return 1
}

stop() {
  serialise "$NAME" "$LOCK_WAIT_S"
  halt
}

halt() { stop_pidfile "$PIDFILE" "$NAME" 60; }

status() {
  if pid_running "$PIDFILE"; then
    say "$NAME: running (pid $(cat "$PIDFILE"))"
  else
    say "$NAME: stopped"
    return 3
  fi
}

action=${1:?usage: worker.sh start|stop|status [NAME]}
case "$action" in start | stop | status) ;; *) die "unknown command '$action' (start, stop, status)" ;; esac
if [ -n "${2:-}" ]; then
  names=("$2")
else
  mapfile -t names < <(worker_specs | cut -d= -f1)
  [ ${#names[@]} -gt 0 ] || names=(worker)
  if [ "$action" = stop ]; then
    for pidfile in "$STATE_DIR"/worker*.pid; do
      [ -e "$pidfile" ] || continue
      name=$(basename "$pidfile" .pid)
      [[ " ${names[*]} " == *" $name "* ]] || names+=("$name")
    done
  fi
fi
rc=0
for name in "${names[@]}"; do
  select_worker "$name"
  if [ "$action" = status ]; then
    status || rc=3
  else
    "$action" # a failed start stops here (errexit), as for a single worker
  fi
done
exit $rc
