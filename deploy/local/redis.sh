#!/usr/bin/env bash
# Runs Debian's redis-server on 127.0.0.1 with append-only persistence, data under the state dir.
# Usage: redis.sh install|start|stop|status
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PORT=${RAGLINE_REDIS_PORT:-6379}
DIR=$STATE_DIR/redis
PIDFILE=$DIR/redis.pid
LOG=$LOG_DIR/redis.log
# Redis titles itself by its address alone, which another state dir's Redis may have had; it runs in
# its data dir (`dir`), which is this state dir's own.
PID_MATCH='^redis-server '
PID_CWD=$(cd "$DIR" 2>/dev/null && pwd -P || echo "$DIR")

install() {
  if ! command -v redis-server >/dev/null; then
    say "redis: installing Debian's redis-server"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  fi
}

# running: this state dir's Redis runs. Its pid file, where it went missing (removed by hand), is
# written again from the redis-server running in this data dir: Redis writes it only as it starts,
# and without it status, stop and the next start lost their server.
running() {
  pid_running "$PIDFILE" && return 0
  local p
  for p in /proc/[0-9]*; do
    [ "$(cat "$p/comm" 2>/dev/null)" = redis-server ] || continue
    [ "$(readlink "$p/cwd" 2>/dev/null)" = "$PID_CWD" ] || continue
    echo "${p#/proc/}" >"$PIDFILE"
    pid_running "$PIDFILE" && return 0
  done
  return 1
}

# Bounded: a port that accepts but never answers held the start for good.
ping() { timeout 5 redis-cli -h 127.0.0.1 -p "$PORT" ping 2>/dev/null | grep -q PONG; }

# One start or stop at a time (serialise), as for the other servers.
start() {
  install
  serialise redis
  mkdir -p "$DIR"
  if running; then
    say "redis: already running on redis://127.0.0.1:$PORT"
    return 0
  fi
  if ping; then
    die "port $PORT already answers Redis but not from $PIDFILE; stop it or set RAGLINE_REDIS_PORT (docs/configuration.md#local-stack-scripts)"
  fi
  cat >"$DIR/redis.conf" <<CONF
bind 127.0.0.1
port $PORT
protected-mode yes
daemonize no
dir $(quoted "$DIR")
appendonly yes
appendfsync everysec
save 60 1000
logfile $(quoted "$LOG")
pidfile $(quoted "$PIDFILE")
CONF
  # On its stdin: Redis reads a config path holding '*', '?' or '[' as a glob, which matched
  # nothing (and Redis ran on its defaults, port 6379) or another state dir's file.
  (cd "$DIR" && exec setsid redis-server -) <"$DIR/redis.conf" >>"$LOG" 2>&1 9>&- &
  local launched=$!
  if ! wait_until --pid "$launched" 30 redis "$LOG" ping \
    || ! wait_until --pid "$launched" 10 redis "$LOG" test -s "$PIDFILE"; then
    stop_launched "$launched" # not left running where the next start could not find it
    exit 1
  fi
  say "redis: listening on redis://127.0.0.1:$PORT (data in $DIR)"
}

stop() {
  serialise redis
  running || true
  stop_pidfile "$PIDFILE" redis 20
}

status() {
  if running && ping; then
    say "redis: running on redis://127.0.0.1:$PORT"
  else
    say "redis: stopped"
    return 3
  fi
}

"${1:?usage: redis.sh install|start|stop|status}"
