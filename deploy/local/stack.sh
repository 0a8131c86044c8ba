#!/usr/bin/env bash
# Drives the whole local stack on 127.0.0.1: OpenSearch (with k-NN), Redis, an S3-compatible server
# (S3Proxy, for the S3 blob store), a Celery worker, the API.
# Usage: stack.sh up|down|status [SERVICE...]   SERVICE: opensearch redis s3 worker api
set -euo pipefail
HERE=$(dirname "${BASH_SOURCE[0]}")
source "$HERE/lib.sh"

ALL=(opensearch redis s3 worker api)

service_script() { echo "$HERE/$1.sh"; }

up() {
  local s
  for s in "$@"; do bash "$(service_script "$s")" start; done
}

down() {
  local i
  for ((i = $# ; i > 0; i--)); do bash "$(service_script "${!i}")" stop; done
}

status() {
  local s rc=0
  for s in "$@"; do bash "$(service_script "$s")" status || rc=3; done
  return $rc
}

cmd=${1:?usage: stack.sh up|down|status [SERVICE...]}
shift
[ $# -gt 0 ] || set -- "${ALL[@]}"
for s in "$@"; do
  [ -f "$(service_script "$s")" ] || die "unknown service '$s' (known: ${ALL[*]})"
done
case "$cmd" in
  up | down | status) "$cmd" "$@" ;;
  *) die "unknown command '$cmd' (up, down, status)" ;;
esac
