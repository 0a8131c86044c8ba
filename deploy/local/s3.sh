#!/usr/bin/env bash
# A real S3-compatible server on 127.0.0.1: S3Proxy (org.gaul:s3proxy, Apache-2.0) from Maven Central with
# its jclouds `filesystem` backend, which keeps each object as a file under the state dir and writes it to a
# temporary file first, so a failed upload never shows a partial object.
#
# Usage: s3.sh install|start|stop|status
#   install  fetch S3Proxy's self-contained jar with Maven into ${RAGLINE_CACHE_DIR:-~/.cache/ragline}/s3proxy-<version>/
#            (idempotent: a finished install is marked and never redone)
#   start    install if needed, start in the background, wait until it answers a signed request and create
#            the bucket `ragline` if it is missing; a no-op when already running
#   stop     SIGTERM, then SIGKILL after a grace period
#   status   "running" with rc 0, or "stopped" with rc 3
#
# Credentials: generated once into $RAGLINE_STATE_DIR/s3/blobs.env (mode 600), which also holds the settings
# that put Ragline's blob store on this server (RAGLINE_BLOBS__URL, __ENDPOINT_URL, __REGION,
# __ACCESS_KEY_ID, __SECRET_ACCESS_KEY); `set -a; . .ragline/s3/blobs.env; set +a` before starting a
# worker or the API uses it. Deleting the file makes the next start generate new ones.
#
# Environment:
#   RAGLINE_S3_PORT        port (9100)
#   RAGLINE_S3_VERSION     S3Proxy version (4.1.0; 4.x needs Java 17)
#   RAGLINE_S3_JAVA_HOME   JDK to run with (default: /usr/lib/jvm/java-17-openjdk-amd64, else `java` on PATH)
#   RAGLINE_S3_HEAP        JVM heap, -Xmx (256m)
#   RAGLINE_CACHE_DIR      install cache (~/.cache/ragline)
#   RAGLINE_STATE_DIR      runtime state (<repo>/.ragline): data in s3/data, log in logs/s3.log
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

VERSION=${RAGLINE_S3_VERSION:-4.1.0}
PORT=${RAGLINE_S3_PORT:-9100}
HEAP=${RAGLINE_S3_HEAP:-256m}
CACHE_DIR=${RAGLINE_CACHE_DIR:-$HOME/.cache/ragline}
HOME_DIR=$CACHE_DIR/s3proxy-$VERSION
JAR=$HOME_DIR/s3proxy.jar
MARKER=$HOME_DIR/.ragline-install-complete
DIR=$STATE_DIR/s3
DATA=$DIR/data
PIDFILE=$DIR/s3proxy.pid
CONF=$DIR/s3proxy.conf
ENV_FILE=$DIR/blobs.env
LOG=$LOG_DIR/s3.log
PID_MATCH="s3proxy\\.jar --properties $(literal "$CONF")\$"
# It runs in its dir (see start): another program's arguments may name the same jar and conf.
PID_CWD=$(cd "$DIR" 2>/dev/null && pwd -P || echo "$DIR")
URL=http://127.0.0.1:$PORT
BUCKET=ragline
REGION=us-east-1
MVN_DEP_PLUGIN=org.apache.maven.plugins:maven-dependency-plugin:3.6.1
# SHA-256 of an empty body: S3 wants the payload's hash in a header of every signed request.
EMPTY_SHA256=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855

java_bin() {
  if [ -n "${RAGLINE_S3_JAVA_HOME:-}" ]; then
    echo "$RAGLINE_S3_JAVA_HOME/bin/java"
  elif [ -x /usr/lib/jvm/java-17-openjdk-amd64/bin/java ]; then
    echo /usr/lib/jvm/java-17-openjdk-amd64/bin/java
  else
    command -v java || echo java
  fi
}

install() {
  if [ -f "$MARKER" ]; then
    return 0
  fi
  command -v mvn >/dev/null || die "s3: mvn not found (apt-get install maven)"
  mkdir -p "$CACHE_DIR"
  (
    flock -w 600 9 || die "s3: timed out waiting for the install lock"
    [ -f "$MARKER" ] || fetch
  ) 9>"$CACHE_DIR/.s3proxy-$VERSION.lock"
}

fetch() {
  local work
  work=$(mktemp -d "$CACHE_DIR/.s3proxy-$VERSION.XXXXXX")
  say "s3: fetching S3Proxy $VERSION from Maven Central"
  # The jar-with-dependencies is the project's own release artifact: one file, nothing to assemble.
  if ! JAVA_HOME=$(dirname "$(dirname "$(readlink -f "$(java_bin)")")") mvn -B -q -Dstyle.color=never \
    "$MVN_DEP_PLUGIN:copy" -Dartifact="org.gaul:s3proxy:$VERSION:jar:jar-with-dependencies" \
    -DoutputDirectory="$work" >"$work/mvn.log" 2>&1; then
    tail -n 20 "$work/mvn.log" >&2
    rm -rf "$work"
    die "s3: could not fetch org.gaul:s3proxy:$VERSION (jar-with-dependencies) from Maven Central"
  fi
  rm -rf "$HOME_DIR"
  mkdir -p "$HOME_DIR"
  mv "$work/s3proxy-$VERSION-jar-with-dependencies.jar" "$JAR"
  rm -rf "$work"
  touch "$MARKER"
  say "s3: installed $JAR"
}

# Generated once: a local server still gets credentials of its own, as the API gets a key.
credentials() {
  if [ ! -s "$ENV_FILE" ]; then
    local id secret
    id="ragline$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    secret=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
    (umask 077 && cat >"$ENV_FILE" <<ENV
RAGLINE_BLOBS__URL=s3://$BUCKET/blobs
RAGLINE_BLOBS__ENDPOINT_URL=$URL
RAGLINE_BLOBS__REGION=$REGION
RAGLINE_BLOBS__ACCESS_KEY_ID=$id
RAGLINE_BLOBS__SECRET_ACCESS_KEY=$secret
ENV
    )
    say "s3: generated local credentials in $ENV_FILE"
  fi
  ACCESS_KEY=$(sed -n 's/^RAGLINE_BLOBS__ACCESS_KEY_ID=//p' "$ENV_FILE")
  SECRET_KEY=$(sed -n 's/^RAGLINE_BLOBS__SECRET_ACCESS_KEY=//p' "$ENV_FILE")
  [ -n "$ACCESS_KEY" ] && [ -n "$SECRET_KEY" ] || die "s3: $ENV_FILE lacks the access key or the secret; delete it to make new ones"
}

# signed METHOD PATH: the HTTP status of a SigV4-signed request without a body.
signed() {
  curl -s -o /dev/null -w '%{http_code}' --max-time 5 -X "$1" \
    --aws-sigv4 "aws:amz:$REGION:s3" --user "$ACCESS_KEY:$SECRET_KEY" \
    -H "x-amz-content-sha256: $EMPTY_SHA256" "$URL$2" 2>/dev/null || true
}

# The server answers a signed request with our credentials (any bucket state: 200 or 404).
answers() {
  case "$(signed HEAD "/$BUCKET")" in
    200 | 404) return 0 ;;
  esac
  return 1
}

ensure_bucket() {
  [ "$(signed HEAD "/$BUCKET")" = 200 ] && return 0
  local code
  code=$(signed PUT "/$BUCKET")
  [ "$code" = 200 ] || die "s3: could not create bucket $BUCKET (HTTP $code); see $LOG"
  say "s3: created bucket $BUCKET"
}

# One start or stop at a time (serialise): two starts at once both wrote new credentials, and the
# one that timed out stopped the other's server on its way out.
start() {
  install
  serialise s3
  mkdir -p "$DIR" "$DATA"
  credentials
  if pid_running "$PIDFILE"; then
    say "s3: already running on $URL (pid $(cat "$PIDFILE"))"
    ensure_bucket
    return 0
  fi
  if curl -s -o /dev/null --max-time 2 "$URL/"; then
    die "s3: port $PORT already answers but not from $PIDFILE; stop it or set RAGLINE_S3_PORT (docs/configuration.md#local-stack-scripts)"
  fi
  (umask 077 && cat >"$CONF" <<CONF
s3proxy.endpoint=$URL
s3proxy.authorization=aws-v2-or-v4
s3proxy.identity=$ACCESS_KEY
s3proxy.credential=$SECRET_KEY
jclouds.provider=filesystem
CONF
  )
  fresh_log "$LOG"
  # The data dir goes as a system property, which S3Proxy lays over its conf: one argument needs no
  # escaping, where a properties file reads '\' as an escape and its bytes as Latin-1. The JVM
  # decodes arguments and paths by the locale, so it gets UTF-8 whatever the caller's.
  (cd "$DIR" && LC_ALL=C.UTF-8 exec setsid "$(java_bin)" "-Xmx$HEAP" -XX:+UseSerialGC \
    -XX:TieredStopAtLevel=1 "-Djclouds.filesystem.basedir=$DATA" \
    -jar "$JAR" --properties "$CONF") >>"$LOG" 2>&1 </dev/null 9>&- &
  echo $! >"$PIDFILE"
  wait_until --pid $! 60 s3 "$LOG" answers || { stop >/dev/null; exit 1; }
  ensure_bucket
  say "s3: listening on $URL (S3Proxy $VERSION, bucket $BUCKET, data in $DATA, settings in $ENV_FILE)"
}

stop() {
  serialise s3
  stop_pidfile "$PIDFILE" s3 20
}

status() {
  if pid_running "$PIDFILE" && curl -s -o /dev/null --max-time 2 "$URL/"; then
    say "s3: running on $URL"
  else
    say "s3: stopped"
    return 3
  fi
}

"${1:?usage: s3.sh install|start|stop|status}"
