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

# quoted TEXT: TEXT as one argument of a redis.conf line (a state dir's path may hold spaces).
quoted() { printf '"%s"' "$(printf '%s' "$1" | sed 's/[\\"]/\\&/g')"; }

ping() { redis-cli -h 127.0.0.1 -p "$PORT" ping 2>/dev/null | grep -q PONG; }

start() {
  install
  mkdir -p "$DIR"
  if pid_running "$PIDFILE"; then
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
  setsid redis-server "$DIR/redis.conf" >>"$LOG" 2>&1 </dev/null &
  wait_until 30 redis "$LOG" ping
  wait_until 10 redis "$LOG" test -s "$PIDFILE"
  say "redis: listening on redis://127.0.0.1:$PORT (data in $DIR)"
}

stop() { stop_pidfile "$PIDFILE" redis 20; }

status() {
  if pid_running "$PIDFILE" && ping; then
    say "redis: running on redis://127.0.0.1:$PORT"
  else
    say "redis: stopped"
    return 3
  fi
}

"${1:?usage: redis.sh install|start|stop|status}"
