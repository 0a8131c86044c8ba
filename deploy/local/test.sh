#!/usr/bin/env bash
# The test run: starts the local services that are not running, runs the linters and every test
# layer against them, then the tests that store blobs once more with the S3 blob store (the S3
# pass, below), then stops only what it started. Exits non-zero on any failure.
# Usage: test.sh [PYTEST ARGS...]   (with arguments: only those tests, no linters; with
#        RAGLINE_TEST_BLOBS=s3 as well, only those tests, as the S3 pass runs them)
set -uo pipefail
HERE=$(dirname "${BASH_SOURCE[0]}")
source "$HERE/lib.sh"
cd "$REPO_ROOT"

SERVICES=(opensearch redis s3 worker api)
started=()

# The S3 pass: the tests that store, read, pin and remove blobs (uploads, the pipeline, erasure,
# recovery) run again with RAGLINE_BLOBS__* naming the local S3 server's bucket (its settings in
# .ragline/s3/blobs.env), in an instance of their own beside the stack: its own state dir, Redis
# database, index prefix and worker, which reads the S3 settings when it starts. The stack's own
# worker, its blobs and its indexes stay as they are.
S3_PASS_TESTS=(
  tests/integration/test_pipeline.py
  tests/integration/test_pii_erasure.py
  tests/integration/test_recovery.py
  tests/integration/test_kb_updates.py
  tests/integration/test_stage_artifacts.py
)
S3_PASS_STATE=$STATE_DIR/s3-pass
s3_pass_state="" # set while the S3 pass's worker may run, so the teardown stops it too

# Stops what this run started, whichever instance runs now (tests restart services; stack.sh finds
# them by the state dir). A signal to this run's process group during the teardown (Ctrl-C, timeout,
# `kill -- -PGID`) used to end it half way, bash abandoning its EXIT trap, and leave the services
# stopped last (redis, opensearch) running. So this shell ignores further signals, and the teardown
# runs in a session of its own (out of reach of the group, SIGKILL included), logging to a file
# (the terminal or pipe may be gone), all of it even when a stop fails.
cleanup() {
  trap '' HUP INT TERM
  [ ${#started[@]} -gt 0 ] || [ -n "$s3_pass_state" ] || return 0
  local log=$LOG_DIR/test-teardown.log
  setsid -w bash -c '[ -z "$1" ] || RAGLINE_STATE_DIR=$1 bash "$0" down worker; shift
    for ((i = $#; i > 0; i--)); do bash "$0" down "${!i}"; done' \
    "$HERE/stack.sh" "$s3_pass_state" "${started[@]}" </dev/null >"$log" 2>&1
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
# s3_pass PYTEST ARGS...: pytest in the S3 pass's instance, its worker started and stopped around it.
s3_pass() {
  [ -s "$STATE_DIR/s3/blobs.env" ] || { echo "error: no $STATE_DIR/s3/blobs.env; is s3 up?" >&2; return 1; }
  s3_pass_state=$S3_PASS_STATE
  (
    set -a
    # shellcheck disable=SC1091
    source "$STATE_DIR/s3/blobs.env"
    RAGLINE_STATE_DIR=$S3_PASS_STATE
    RAGLINE_REDIS__URL=${RAGLINE_S3_PASS_REDIS_URL:-redis://127.0.0.1:${RAGLINE_REDIS_PORT:-6379}/1}
    RAGLINE_OPENSEARCH__INDEX_PREFIX=ragline-s3pass
    RAGLINE_METRICS__WORKER_PORT=0
    set +a
    bash "$HERE/stack.sh" up worker || exit 1
    "$VENV/bin/pytest" "$@"
    rc=$?
    bash "$HERE/stack.sh" down worker
    exit $rc
  )
  local rc=$?
  s3_pass_state=""
  return $rc
}

if [ $# -gt 0 ] && [ "${RAGLINE_TEST_BLOBS:-}" = s3 ]; then
  step "pytest (S3 blob store) $*" s3_pass "$@"
elif [ $# -gt 0 ]; then
  # Only the named tests (make soak): the linters have nothing to say about a longer run.
  step "pytest $*" "$VENV/bin/pytest" "$@"
else
  step "ruff check" "$VENV/bin/ruff" check .
  step "ruff format" "$VENV/bin/ruff" format --check .
  step "mypy --strict" "$VENV/bin/mypy"
  step "pytest" "$VENV/bin/pytest" tests/unit tests/integration tests/e2e
  step "pytest (S3 blob store)" s3_pass "${S3_PASS_TESTS[@]}"
fi

if [ ${#failed[@]} -gt 0 ]; then
  printf '\nFAILED: %s\n' "${failed[*]}"
  exit 1
fi
printf '\nall checks passed\n'
