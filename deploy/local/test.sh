#!/usr/bin/env bash
# The test run: starts the local services that are not running, runs the linters and every test
# layer against them, then stops only what it started. Exits non-zero on any failure.
# Usage: test.sh [PYTEST ARGS...]   (with arguments: only those tests, no linters)
set -uo pipefail
HERE=$(dirname "${BASH_SOURCE[0]}")
source "$HERE/lib.sh"
cd "$REPO_ROOT"

SERVICES=(opensearch redis s3 worker api)
started=()

# Stops what this run started, whichever instance runs now (tests restart services; stack.sh finds
# them by the state dir). A signal to this run's process group during the teardown (Ctrl-C, timeout,
# `kill -- -PGID`) used to end it half way, bash abandoning its EXIT trap, and leave the services
# stopped last (redis, opensearch) running. So this shell ignores further signals, and the teardown
# runs in a session of its own (out of reach of the group, SIGKILL included), logging to a file
# (the terminal or pipe may be gone), all of it even when a stop fails.
cleanup() {
  trap '' HUP INT TERM
  [ ${#started[@]} -gt 0 ] || return 0
  local log=$LOG_DIR/test-teardown.log
  setsid -w bash -c 'for ((i = $#; i > 0; i--)); do bash "$0" down "${!i}"; done' \
    "$HERE/stack.sh" "${started[@]}" </dev/null >"$log" 2>&1
  cat "$log" 2>/dev/null || true
}
trap cleanup EXIT

for s in "${SERVICES[@]}"; do
  if ! bash "$HERE/stack.sh" status "$s" >/dev/null; then
    bash "$HERE/stack.sh" up "$s" || { echo "error: could not start $s" >&2; exit 1; }
    started+=("$s")
  fi
done

export HF_HUB_OFFLINE=1 DO_NOT_TRACK=1 ORT_DISABLE_TELEMETRY=1 TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS=""
failed=()
step() {
  local name=$1
  shift
  printf '\n== %s\n' "$name"
  "$@" || failed+=("$name")
}
if [ $# -gt 0 ]; then
  # Only the named tests (make soak): the linters have nothing to say about a longer run.
  step "pytest $*" "$VENV/bin/pytest" "$@"
else
  step "ruff check" "$VENV/bin/ruff" check .
  step "ruff format" "$VENV/bin/ruff" format --check .
  step "mypy --strict" "$VENV/bin/mypy"
  step "pytest" "$VENV/bin/pytest" tests/unit tests/integration tests/e2e
fi

if [ ${#failed[@]} -gt 0 ]; then
  printf '\nFAILED: %s\n' "${failed[*]}"
  exit 1
fi
printf '\nall checks passed\n'
