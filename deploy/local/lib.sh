# Helpers shared by the local-stack scripts (sourced, not run).
# shellcheck shell=bash

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
STATE_DIR=${RAGLINE_STATE_DIR:-$REPO_ROOT/.ragline}
# The path goes into config files of four formats and onto command lines: one holding control
# characters (a newline ends a line in all of them), bytes that are not UTF-8 (the JVMs decode
# paths as UTF-8) or "${" (OpenSearch expands it in its settings, even in a path it was given
# relative) would be misread by one of them, so it is refused.
if ! iconv -f UTF-8 -t UTF-8 <<<"$STATE_DIR" >/dev/null 2>&1 \
  || (LC_ALL=C.UTF-8 && [[ $STATE_DIR == *[[:cntrl:]]* ]]) || [[ $STATE_DIR == *'${'* ]]; then
  printf 'error: RAGLINE_STATE_DIR %q holds control characters, bytes that are not UTF-8 or "${"\n' \
    "$STATE_DIR" >&2
  exit 1
fi
case $STATE_DIR in /*) ;; *) STATE_DIR=./$STATE_DIR ;; esac # never an option, nor cd's "-"
# Absolute, and passed on so: the servers and services started here resolve it from other dirs,
# and a service's own tells whose it is (see pid_running).
mkdir -p "$STATE_DIR"
STATE_DIR=$(CDPATH='' cd "$STATE_DIR" && pwd)
export RAGLINE_STATE_DIR=$STATE_DIR
# quoted TEXT: TEXT in double quotes with '\' and '"' escaped: one JSON string, YAML scalar or
# redis.conf argument (the state dir's path may hold spaces, quotes, '#' or ': ').
quoted() { printf '"%s"' "$(printf '%s' "$1" | sed 's/[\\"]/\\&/g')"; }

VENV=${RAGLINE_VENV:-$REPO_ROOT/.venv}
LOG_DIR=$STATE_DIR/logs
mkdir -p "$LOG_DIR"
# A service's command line, as an ERE, and its working directory, where its script sets them, and
# whether it must run with this state dir (see pid_running); never the caller's.
PID_MATCH=
PID_CWD=
PID_OWN_STATE=
# The local stack's folder sources read under the state dir's sources/ unless told otherwise
# (docs/api.md#sources): a source may only read where an operator allowed it.
export RAGLINE_SOURCES__FOLDER_ROOTS=${RAGLINE_SOURCES__FOLDER_ROOTS:-"[$(quoted "$STATE_DIR/sources")]"}
mkdir -p "$STATE_DIR/sources"
# A server moved to another port (RAGLINE_OPENSEARCH_PORT, RAGLINE_REDIS_PORT) is the one the
# services started here use, unless their URL says otherwise: else they would reach whatever still
# answers on the default port, another stack's server perhaps.
if [ -n "${RAGLINE_OPENSEARCH_PORT:-}" ]; then
  export RAGLINE_OPENSEARCH__URL=${RAGLINE_OPENSEARCH__URL:-http://127.0.0.1:$RAGLINE_OPENSEARCH_PORT}
fi
if [ -n "${RAGLINE_REDIS_PORT:-}" ]; then
  export RAGLINE_REDIS__URL=${RAGLINE_REDIS__URL:-redis://127.0.0.1:$RAGLINE_REDIS_PORT/0}
fi

# The services run this checkout's code, whichever virtual environment holds the packages: a
# RAGLINE_VENV made by another checkout has that checkout's editable install, which would win.
case "${PYTHONPATH:-}" in
  "$REPO_ROOT" | "$REPO_ROOT":*) ;;
  *) export PYTHONPATH=$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH} ;;
esac

say() { printf '%s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
# The Python services run from $VENV: the checkout's .venv, or RAGLINE_VENV where another holds them.
require_ragline() {
  [ -x "$VENV/bin/ragline" ] && return 0
  if [ -n "${RAGLINE_VENV:-}" ]; then
    die "$VENV/bin/ragline not found: RAGLINE_VENV names a virtual environment without Ragline installed"
  fi
  die "$VENV/bin/ragline not found; run 'make install' first, or set RAGLINE_VENV to a virtual environment that has it"
}

# fresh_log LOG: an empty log for a new run; the last run's stays beside it as LOG.1, so a service
# that died and was started again (by a test, by hand) still shows why it died.
fresh_log() {
  [ -s "$1" ] && mv -f "$1" "$1.1"
  : >"$1"
}

# pid_running PIDFILE: true when the file names a live process, one whose command line matches
# $PID_MATCH, whose working directory is $PID_CWD and, with $PID_OWN_STATE, whose state dir is this
# one, where the script sets them (a pid file that outlived its process, across a reboot or a
# crash, can name another program's, or another stack's, which `stop` would signal); removes a
# stale file.
pid_running() {
  local pidfile=$1 pid
  [ -f "$pidfile" ] || return 1
  pid=$(cat "$pidfile" 2>/dev/null || true)
  if [ -n "$pid" ] && alive "$pid" && { [ -z "${PID_MATCH:-}" ] || ours "$pid"; } \
    && { [ -z "${PID_CWD:-}" ] || [ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" = "$PID_CWD" ]; } \
    && { [ -z "${PID_OWN_STATE:-}" ] || [ "$(state_dir_of "$pid")" = "$STATE_DIR" ]; }; then
    return 0
  fi
  rm -f "$pidfile"
  return 1
}

# state_dir_of PID: the state dir a service of ours runs with: its RAGLINE_STATE_DIR, which these
# scripts always pass on, else the default (a service started before they did).
state_dir_of() {
  local theirs
  [ -r "/proc/$1/environ" ] || return 1
  theirs=$(tr '\0' '\n' 2>/dev/null <"/proc/$1/environ" | sed -n 's/^RAGLINE_STATE_DIR=//p' | tail -n 1) \
    && printf '%s' "${theirs:-$REPO_ROOT/.ragline}"
}

# alive PID: the process runs (kill -0 still finds a zombie).
alive() { kill -0 "$1" 2>/dev/null && ! zombie "$1"; }

# ours PID: its command line matches $PID_MATCH. Read from /proc, not ps, which prints the bytes of
# non-ASCII paths as "?" under some locales; the NULs ending a retitled command line (Redis) go.
ours() {
  local args
  args=$(tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline") || return 1
  args=${args%"${args##*[! ]}"}
  [[ $args =~ $PID_MATCH ]]
}

# literal TEXT: TEXT as an ERE that matches it alone (a path may hold + ( ) [ ] and the like).
literal() { printf '%s' "$1" | sed 's/[][\\.^$*+?(){}|]/\\&/g'; }

# serialise NAME [SECONDS]: hold NAME's lock in the state dir (fd 9) until the script exits, so
# that two starts, or a start and a stop, of one service never interleave; what a start launches
# gets 9>&-. Waits up to SECONDS (180) for another start or stop to end.
serialise() {
  exec 9>"$STATE_DIR/$1.lock"
  flock -w "${2:-180}" 9 || die "$1: another start or stop holds $STATE_DIR/$1.lock"
}

# stop_launched PID: a process this script launched, and its group when it leads one, stopped:
# TERM, then KILL after a grace, for a start that failed before any pid file could name it.
stop_launched() {
  local pid=$1 i
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < 100; i++)); do
    alive "$pid" || return 0
    sleep 0.1
  done
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
}

# zombie PID: true for a process that died but is not reaped yet (kill -0 still finds it).
zombie() {
  case "$(ps -o stat= -p "$1" 2>/dev/null)" in
    Z*) return 0 ;;
  esac
  return 1
}

# stop_pidfile PIDFILE NAME [GRACE_SECONDS]: SIGTERM the process group, then SIGKILL after the grace.
stop_pidfile() {
  local pidfile=$1 name=$2 grace=${3:-30} pid i
  if ! pid_running "$pidfile"; then
    say "$name: not running"
    return 0
  fi
  pid=$(cat "$pidfile")
  # Each service is started in its own session (setsid), so the group holds its children too.
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < grace * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    say "$name: did not stop within ${grace}s, killing"
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  # Children left in the group (e.g. pool processes) go too.
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "$pidfile"
  say "$name: stopped"
}

# wait_until [--pid PID] SECONDS NAME LOGFILE COMMAND...: poll COMMAND until it succeeds, else
# fail with the log tail; with --pid, fail at once when that process exits meanwhile (a refused
# configuration, a port taken) rather than after SECONDS.
wait_until() {
  local pid=""
  if [ "$1" = --pid ]; then
    pid=$2
    shift 2
  fi
  local timeout=$1 name=$2 logfile=$3
  shift 3
  local deadline=$((SECONDS + timeout)) # the clock's, not a count of polls: a poll may take seconds
  while ((SECONDS < deadline)); do
    if "$@" >/dev/null 2>&1; then
      return 0
    fi
    if [ -n "$pid" ] && ! alive "$pid"; then
      printf 'error: %s exited while starting; last lines of %s:\n' "$name" "$logfile" >&2
      tail -n 40 "$logfile" >&2 2>/dev/null || true
      return 1
    fi
    sleep 0.5
  done
  printf 'error: %s did not become healthy within %ss; last lines of %s:\n' "$name" "$timeout" "$logfile" >&2
  tail -n 40 "$logfile" >&2 2>/dev/null || true
  return 1
}
