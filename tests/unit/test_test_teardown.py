"""deploy/local/test.sh stops what it started, restarted or not, even when its group is signalled
during the teardown, and leaves alone a service that ran before. Fake services: no real stack."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# A fake service: `sleep` in a session of its own, its pid in STATE/<name>.pid and in a ledger;
# the worker takes 3 s to stop, like Celery's warm shutdown, which opens the window.
FAKE = r"""#!/usr/bin/env bash
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
name=$(basename "$0" .sh); pidfile=$STATE_DIR/$name.pid
case "$1" in
  start) pid_running "$pidfile" && exit 0
         setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $! >"$pidfile"; echo $! >>"$STATE_DIR/ledger"
         echo "$name: started" ;;
  stop)  if pid_running "$pidfile"; then [ "$name" != worker ] || sleep 3; kill "$(cat "$pidfile")"; fi
         rm -f "$pidfile"; echo "$name: stopped" ;;
  status) pid_running "$pidfile" ;;
esac
"""
# The tests: restart redis and opensearch the way tests/integration/stack_control.py does.
PYTEST = """#!/usr/bin/env bash
stack="$PWD/deploy/local/stack.sh"
for s in redis opensearch; do bash "$stack" down $s && bash "$stack" up $s; done >/dev/null
"""


def _tree(tmp: Path) -> Path:
    local = tmp / "deploy" / "local"
    local.mkdir(parents=True)
    for script in ("test.sh", "lib.sh", "stack.sh"):
        shutil.copy(REPO / "deploy" / "local" / script, local / script)
    for name in ("opensearch", "redis", "s3", "worker", "api"):
        (local / f"{name}.sh").write_text(FAKE)
    (tmp / ".venv" / "bin").mkdir(parents=True)
    (tmp / ".venv" / "bin" / "pytest").write_text(PYTEST)
    (tmp / ".venv" / "bin" / "pytest").chmod(0o755)
    return tmp / ".ragline"


def _alive(pid: int) -> bool:
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig", [None, signal.SIGTERM, signal.SIGKILL])
def test_teardown_stops_what_it_started_and_nothing_else(tmp_path: Path, sig: signal.Signals | None) -> None:
    state = _tree(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGLINE_")}
    stack = ["bash", "deploy/local/stack.sh"]
    subprocess.run([*stack, "up", "api"], cwd=tmp_path, env=env, check=True)  # a developer's API
    theirs = int((state / "api.pid").read_text())
    out = tmp_path / "out"
    with out.open("w") as log:
        run = subprocess.Popen(
            ["bash", "deploy/local/test.sh", "x"],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        while "all checks passed" not in out.read_text() and run.poll() is None:
            time.sleep(0.1)
        if sig is not None:
            time.sleep(1)  # inside the worker's stop
            os.killpg(run.pid, sig)  # what Ctrl-C, `timeout` or `kill -- -PGID` does
        run.wait(timeout=60)
        time.sleep(4)  # a teardown that outlives test.sh (SIGKILL) finishes
        ours = [int(p) for p in (state / "ledger").read_text().split()]
        assert theirs in ours
        assert len(ours) == 7  # api, then 4 started + redis and opensearch again
        left = [p for p in ours if _alive(p) and p != theirs]
        assert left == [], out.read_text()
        assert _alive(theirs)
    finally:
        for p in [int(p) for p in (state / "ledger").read_text().split()]:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


# The tests of the S3 pass: they note which blob store and state dir they were given, then hold.
PASS_PYTEST = """#!/usr/bin/env bash
echo "$RAGLINE_STATE_DIR $RAGLINE_BLOBS__URL" >"$PASS_SEEN"
[ "${PASS_HOLD:-0}" = 0 ] || sleep 60
"""


@pytest.mark.parametrize("sig", [None, signal.SIGTERM])
def test_the_s3_pass_runs_in_its_own_instance_and_stops_its_worker(
    tmp_path: Path, sig: signal.Signals | None
) -> None:
    state = _tree(tmp_path)
    (tmp_path / ".venv" / "bin" / "pytest").write_text(PASS_PYTEST)
    (state / "s3").mkdir(parents=True)
    (state / "s3" / "blobs.env").write_text("RAGLINE_BLOBS__URL=s3://ragline/blobs\n")
    seen = tmp_path / "seen"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGLINE_")}
    env.update(RAGLINE_TEST_BLOBS="s3", PASS_SEEN=str(seen), PASS_HOLD="0" if sig is None else "1")
    out = tmp_path / "out"
    with out.open("w") as log:
        run = subprocess.Popen(
            ["bash", "deploy/local/test.sh", "x"],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    pass_state = state / "s3-pass"
    try:
        while not seen.exists() and run.poll() is None:
            time.sleep(0.1)
        assert seen.read_text().split() == [str(pass_state), "s3://ragline/blobs"], out.read_text()
        if sig is not None:
            os.killpg(run.pid, sig)
        run.wait(timeout=60)
        time.sleep(4)  # a teardown that outlives test.sh finishes
        (pass_worker,) = [int(p) for p in (pass_state / "ledger").read_text().split()]
        assert not _alive(pass_worker), out.read_text()
        ours = [int(p) for p in (state / "ledger").read_text().split()]
        assert len(ours) == 5  # the stack's own services, started by this run and stopped again
        assert [p for p in ours if _alive(p)] == [], out.read_text()
        assert ("all checks passed" in out.read_text()) == (sig is None)
    finally:
        for ledger in (state / "ledger", pass_state / "ledger"):
            for p in [int(p) for p in ledger.read_text().split()] if ledger.exists() else []:
                if _alive(p):
                    os.kill(p, signal.SIGKILL)
