"""The local stack's scripts (deploy/local): `api.sh start` fails as soon as the API exits while
starting (a refused configuration; it waited out its 120 s before, then blamed health), a pid file
counts only for the service's own process, and paths with spaces work."""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _env(tmp_path: Path, port: int, **extra: str) -> dict[str, str]:
    """This machine's environment without its Ragline settings (the venv's place kept)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAGLINE_") or k == "RAGLINE_VENV"}
    return {**clean, "RAGLINE_STATE_DIR": str(tmp_path / "state"), "RAGLINE_API__PORT": str(port), **extra}


def _script(
    name: str, command: str, env: dict[str, str], *, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`deploy/local/NAME.sh COMMAND`, its output captured."""
    return subprocess.run(
        ["bash", str(REPO / f"deploy/local/{name}.sh"), command],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _start(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`api.sh start`, then `stop`: an API that started after all is not left running."""
    script = REPO / "deploy/local/api.sh"
    try:
        return subprocess.run(
            ["bash", str(script), "start"],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,  # under the script's own 120 s: waiting those out is a failure
            check=False,
        )
    finally:
        subprocess.run(["bash", str(script), "stop"], env=env, capture_output=True, check=False)


def test_an_api_refusing_its_configuration_fails_the_start_at_once(tmp_path: Path) -> None:
    # Not a number: the settings refuse it.
    env = _env(tmp_path, _free_port(), RAGLINE_CELERY__WORKER_CONCURRENCY="many")
    started = _start(env)
    assert started.returncode != 0
    assert "api exited while starting" in started.stderr, started.stderr
    assert "RAGLINE_CELERY__WORKER_CONCURRENCY" in started.stderr  # the log tail names the setting
    assert not (tmp_path / "state" / "api.pid").exists()


class _Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


def test_a_port_another_server_answers_on_is_refused_not_taken_for_this_api(tmp_path: Path) -> None:
    """The new API cannot bind there, but the other server passed its health check: the start
    said "listening" while its own process was dying."""
    other = ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    env = _env(tmp_path, other.server_port)
    try:
        started = _start(env)
    finally:
        other.shutdown()
    assert started.returncode != 0
    assert "already answers, not as this state dir's API" in started.stderr, started.stderr
    assert not (tmp_path / "state" / "api.pid").exists()


def _listens_here(env: dict[str, str], pid: int) -> int:
    """`api.sh`'s own check that the server answering is `pid`'s, the one a start launched."""
    Path(env["RAGLINE_STATE_DIR"]).mkdir(parents=True, exist_ok=True)
    script = REPO / "deploy/local/api.sh"
    command = ["bash", str(script), "listens_here", str(pid)]
    return subprocess.run(command, env=env, timeout=30, check=False).returncode


def test_the_health_check_counts_only_the_server_this_start_launched(tmp_path: Path) -> None:
    """A server that takes the port between `start`'s check and the API's bind answers the health
    check while the API dies of the taken port: the start must not take it for the API."""
    other = ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    env = _env(tmp_path, other.server_port)
    bystander = subprocess.Popen(["sleep", "30"])
    try:
        assert _listens_here(env, os.getpid()) == 0  # this process holds the socket that answers
        assert _listens_here(env, bystander.pid) == 1  # the same answer, but not the process started
    finally:
        bystander.kill()
        bystander.wait()
        other.shutdown()
        other.server_close()


def test_a_stale_pid_file_naming_another_program_is_not_the_api_and_is_not_signalled(
    tmp_path: Path,
) -> None:
    """A pid file that outlived its service (a reboot, a crash) can name another program: `stop`
    signalled its whole process group, and `start` said "already running" and started nothing.
    Redis's bystander runs in Redis's data dir, which alone does not make it Redis; the API's is
    named as another stack's API is, whose state dir is not this one."""
    env = _env(tmp_path, _free_port())
    state = Path(env["RAGLINE_STATE_DIR"])
    pid_files = {
        "api.sh": state / "api.pid",
        "worker.sh": state / "worker.pid",
        "redis.sh": state / "redis/redis.pid",
        "s3.sh": state / "s3/s3proxy.pid",
    }
    for script, pid_file in pid_files.items():
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        # Named as the service would be, but elsewhere: still not it.
        named = {
            "s3.sh": f"s3proxy.jar --properties {pid_file.parent / 's3proxy.conf'}",
            "api.sh": "ragline serve --host 127.0.0.1 --port 8000",
        }
        command = (
            ["bash", "-c", f"exec -a '{named[script]}' sleep 30"] if script in named else ["sleep", "30"]
        )
        cwd = tmp_path if script == "s3.sh" else pid_file.parent
        others = env | {"RAGLINE_STATE_DIR": str(tmp_path / "another stack")}
        bystander = subprocess.Popen(command, start_new_session=True, cwd=cwd, env=others)
        try:
            pid_file.write_text(f"{bystander.pid}\n")
            stopped = _script(script.removesuffix(".sh"), "stop", env)
            assert stopped.returncode == 0, stopped.stderr
            assert "not running" in stopped.stdout, stopped.stdout
            assert bystander.poll() is None  # still running: not ours to stop
        finally:
            bystander.kill()
            bystander.wait()


def test_two_starts_at_once_leave_one_api_which_the_pid_file_names(tmp_path: Path) -> None:
    """Both starts launched an API before: one of them ran with no pid file naming it, so `stop`
    and `status` could not see it and the next `start` refused the port."""
    env = _env(tmp_path, _free_port(), RAGLINE_AUTH__ALLOW_ANONYMOUS="true")
    script = REPO / "deploy/local/api.sh"
    starts: list[subprocess.Popen[str]] = []
    try:
        starts += [
            subprocess.Popen(["bash", str(script), "start"], env=env, stdout=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        outputs = [start.communicate(timeout=150)[0] for start in starts]
        assert [start.returncode for start in starts] == [0, 0], outputs
        assert sorted("already running" in out for out in outputs) == [False, True], outputs
        pid = int((tmp_path / "state" / "api.pid").read_text())
        serving = subprocess.run(
            ["pgrep", "-f", f"ragline serve --host 127.0.0.1 --port {env['RAGLINE_API__PORT']}"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        assert serving == [str(pid)]
        # A stop without the port the start had still stops the API its pid file names.
        moved = env | {"RAGLINE_API__PORT": str(_free_port())}
        subprocess.run(["bash", str(script), "stop"], env=moved, capture_output=True, timeout=60, check=True)
        assert not _alive(pid)
    finally:
        for start in starts:  # a start that hung holds the lock a stop waits for
            start.kill()
            start.wait()
        # Past the lock's own wait (180 s), so that a stop is never cut short with the API up.
        subprocess.run(["bash", str(script), "stop"], env=env, capture_output=True, timeout=240, check=False)


def _alive(pid: int) -> bool:
    """Running, not a zombie that no one reaped yet (which `kill -0` still finds)."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


# A state dir's path as users name them: spaces, quotes, a backslash, " #" and ": " (YAML's comment
# and mapping), "%p" (Celery's and the JVM's pid placeholder), a letter outside ASCII, glob
# characters (Redis reads its config path as a glob).
AWKWARD = 'state (1) "a" #b: c\\ü%p *?[z]'


def test_redis_runs_from_a_relative_state_dir_whose_path_has_spaces_and_quotes(tmp_path: Path) -> None:
    """redis.conf took the path's first word for `dir` and Redis refused its configuration; and the
    started Redis is the one `status`, a second `start` and `stop` find, from another working
    directory too (a relative state dir went to Redis as it was), and once its pid file is gone."""
    env = {**_env(tmp_path, _free_port()), "RAGLINE_REDIS_PORT": str(_free_port())}
    env["RAGLINE_STATE_DIR"] = AWKWARD

    def redis(command: str) -> subprocess.CompletedProcess[str]:
        absolute = env | {"RAGLINE_STATE_DIR": str(tmp_path / AWKWARD)} if command != "start" else env
        return _script("redis", command, absolute, cwd=tmp_path)

    try:
        started = redis("start")
        assert started.returncode == 0, started.stdout + started.stderr
        assert redis("status").returncode == 0
        again = redis("start")
        assert "already running" in again.stdout, again.stdout + again.stderr
        # A pid file removed by hand: Redis is still this state dir's, for status and stop.
        (tmp_path / AWKWARD / "redis/redis.pid").unlink()
        assert redis("status").returncode == 0
    finally:
        stopped = redis("stop")
    assert "redis: stopped" in stopped.stdout, stopped.stdout + stopped.stderr
    assert redis("status").returncode == 3


def test_two_s3_starts_at_once_leave_one_running_s3proxy(tmp_path: Path) -> None:
    """Both starts wrote new credentials, and the one that timed out stopped the other's server on
    its way out: no S3 server was left."""
    env = {**_env(tmp_path, _free_port()), "RAGLINE_S3_PORT": str(_free_port())}
    script = str(REPO / "deploy/local/s3.sh")

    def s3(command: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["bash", script, command], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    try:
        starts = [s3("start"), s3("start")]
        outputs = [start.communicate(timeout=120)[0] for start in starts]
        assert [start.returncode for start in starts] == [0, 0], outputs
        status = s3("status")
        assert status.wait(timeout=30) == 0, status.communicate()[0]
        conf = tmp_path / "state/s3/s3proxy.conf"
        running = subprocess.run(
            ["pgrep", "-f", "--", f"--properties {conf}"], capture_output=True, text=True, check=False
        )
        assert len(running.stdout.split()) == 1, running.stdout
    finally:
        s3("stop").wait(timeout=60)


def test_s3_runs_from_a_state_dir_with_a_backslash_and_non_ascii_under_the_c_locale(tmp_path: Path) -> None:
    """S3Proxy read its data dir from a properties file, where a backslash is an escape and bytes
    are Latin-1: its objects went elsewhere. Under the C locale `ps` printed the path's other
    bytes as "?", so `status` took the running server for stopped and `stop` left it running."""
    state = tmp_path / AWKWARD
    env = {**_env(tmp_path, _free_port()), "RAGLINE_S3_PORT": str(_free_port()), "LC_ALL": "C"}
    env["RAGLINE_STATE_DIR"] = str(state)

    def s3(command: str) -> subprocess.CompletedProcess[str]:
        return _script("s3", command, env, timeout=120)

    try:
        started = s3("start")
        assert started.returncode == 0, started.stdout + started.stderr
        assert (state / "s3/data/ragline").is_dir()  # the bucket, where the script says its data is
        status = s3("status")
        assert status.returncode == 0, status.stdout + status.stderr
    finally:
        stopped = s3("stop")
    assert "s3: stopped" in stopped.stdout, stopped.stdout + stopped.stderr
    running = subprocess.run(
        ["pgrep", "-f", "--", "s3proxy.jar"], capture_output=True, text=True, check=False
    )
    assert not [pid for pid in running.stdout.split() if _runs_in(int(pid), state)]


def _runs_in(pid: int, folder: Path) -> bool:
    try:
        return Path(f"/proc/{pid}/cwd").resolve().is_relative_to(folder)
    except OSError:
        return False


@pytest.mark.parametrize("broker", ["refuses", "never answers"])
def test_a_worker_that_cannot_reach_its_broker_fails_its_start_soon_naming_it(
    tmp_path: Path, broker: str
) -> None:
    """Celery retries a broker it cannot reach for many minutes: the start waited out its 180 s
    before it failed, and said only that the worker was not healthy. A broker that accepts
    connections but never answers logs no refusal at all."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        if broker == "never answers":
            silent.listen(8)
        port = silent.getsockname()[1]
        env = _env(tmp_path, _free_port(), RAGLINE_REDIS__URL=f"redis://:secret@127.0.0.1:{port}/0")
        env["RAGLINE_METRICS__WORKER_PORT"] = "0"
        try:
            started = _script("worker", "start", env, timeout=90)
        finally:
            _script("worker", "stop", env, timeout=120)
    assert started.returncode != 0
    assert f"cannot reach its broker (redis://:**@127.0.0.1:{port}/0: " in started.stderr, started.stderr
    assert "secret" not in started.stderr + started.stdout
    assert not (tmp_path / "state" / "logs" / "worker.log").exists()  # asked before any launch


def test_a_worker_start_waits_for_another_start_or_stop_of_that_worker(tmp_path: Path) -> None:
    """Two starts of one worker at once each launched a worker for the same pid file."""
    env = _env(tmp_path, _free_port(), RAGLINE_REDIS__URL=f"redis://127.0.0.1:{_free_port()}/0")
    (tmp_path / "state").mkdir()
    with (tmp_path / "state" / "worker.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as a start in progress holds it
        start = subprocess.Popen(
            ["bash", str(REPO / "deploy/local/worker.sh"), "start"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            with pytest.raises(subprocess.TimeoutExpired):
                start.communicate(timeout=15)  # it waits rather than checking and launching
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    _, stderr = start.communicate(timeout=90)
    assert "cannot reach its broker" in stderr, stderr  # its turn came, and went on to the broker


def test_a_state_dir_with_control_characters_or_bytes_outside_utf8_is_refused(tmp_path: Path) -> None:
    """A tab or an escape went into JSON and YAML raw (both refuse them), a byte outside UTF-8 into
    the JVMs (which decode paths as UTF-8) and "${HOME}" into OpenSearch (which expands it): each
    failed later, or put data elsewhere, and a newline would have ended a line of every config
    file. A name that reads as an option is a folder like any other."""
    script = str(REPO / "deploy/local/redis.sh")  # bytes in its environment, which _script does not take
    for bad in (b"tab\there", b"esc\x1bhere", b"line\nbreak", b"latin1 \xfc", b"${HOME}"):
        env = {**_env(tmp_path, _free_port())}
        env_bytes = {k.encode(): v.encode() for k, v in env.items()} | {
            b"RAGLINE_STATE_DIR": bytes(tmp_path) + b"/" + bad
        }
        refused = subprocess.run(
            ["bash", script, "status"], env=env_bytes, capture_output=True, timeout=30, check=False
        )
        assert refused.returncode == 1, (bad, refused.stderr)
        assert b"holds control characters, bytes that are not UTF-8 or" in refused.stderr, refused.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # none of them was made
    for option in ("-", "--", "-d"):
        env = {**_env(tmp_path, _free_port()), "RAGLINE_STATE_DIR": option}
        status = _script("redis", "status", env, cwd=tmp_path)
        assert status.returncode == 3, status.stderr
        assert (tmp_path / option / "logs").is_dir()


def test_redis_start_is_bounded_when_its_port_accepts_but_never_answers(tmp_path: Path) -> None:
    """redis-cli's ping waited on such a port without end, and the start with it."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    env = {**_env(tmp_path, _free_port()), "RAGLINE_REDIS_PORT": str(silent.getsockname()[1])}
    try:
        started = _script("redis", "start", env, timeout=90)
    finally:
        silent.close()
        _script("redis", "stop", env)
    assert started.returncode != 0, started.stdout
    assert "redis exited while starting" in started.stderr, started.stderr
