"""deploy/compose.yaml and deploy/Dockerfile checked against the code they deploy.

No Docker here: the files are parsed, never run. What is compared is what breaks only once
deployed: a renamed setting (an old nested name stops the process; an old top-level one is
silently ignored), a renamed CLI command or option, services that lost their way to OpenSearch
or Redis, a port opened beyond loopback, a broker without persistence, an OpenSearch image that
drifted from the version the local stack tests against.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from pydantic import BaseModel
from typer.main import get_command

from services.cli.main import app as cli_app
from shared.config import (
    CONFIG_FILE_ENV,
    ENV_NESTED_DELIMITER,
    ENV_PREFIX,
    REPO_ROOT,
    Settings,
    load_settings,
)
from shared.search import schema

DEPLOY = REPO_ROOT / "deploy"
COMPOSE_FILE = DEPLOY / "compose.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"
RAGLINE_SERVICES = ("api", "worker", "worker-interactive")
WORKER_SERVICES = ("worker", "worker-interactive")
RAGLINE_NAME = re.compile(r"\bRAGLINE_[A-Z0-9_]*[A-Z0-9]")
COMPOSE_VARIABLE = re.compile(r"\$\$|\$\{(?P<name>\w+)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}")


def setting_names(model: type[BaseModel] = Settings, prefix: str = ENV_PREFIX) -> set[str]:
    """Every environment variable the settings read: RAGLINE_SECTION__FIELD, walked from the model."""
    names = set()
    for field_name, field in model.model_fields.items():
        name = prefix + field_name.upper()
        names.add(name)
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            names |= setting_names(field.annotation, name + ENV_NESTED_DELIMITER)
    return names


def interpolate(value: str) -> str:
    """Compose's ${NAME:-default} with the defaults: the file must work without a .env."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        if match.group("op") not in (":-", "-"):
            raise AssertionError(f"{match.group(0)}: give the variable a default")
        return match.group("arg")

    return COMPOSE_VARIABLE.sub(substitute, value)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return loaded


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose["services"]
    return found


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Dockerfile, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in joined.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, rest in dockerfile_instructions():
        if keyword == "ENV":
            for token in shlex.split(rest):
                name, _, value = token.partition("=")
                env[name] = value
    return env


def exec_form(keyword: str) -> list[str]:
    """The last CMD or ENTRYPOINT, which must be in exec (JSON) form: signals reach the process."""
    found = [rest for key, rest in dockerfile_instructions() if key == keyword]
    assert found, f"deploy/Dockerfile has no {keyword}"
    loaded = yaml.safe_load(found[-1])
    assert isinstance(loaded, list), f"{keyword} must use the exec form: {found[-1]}"
    return [str(part) for part in loaded]


def service_env(service: dict[str, Any]) -> dict[str, str]:
    """What a container of the service sees: the image's ENV, then the service's environment."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return image_env() | {name: interpolate(str(value)) for name, value in raw.items()}


def command(service: dict[str, Any]) -> list[str]:
    raw = service.get("command", exec_form("CMD"))
    return [interpolate(part) for part in (shlex.split(raw) if isinstance(raw, str) else raw)]


def settings_of(service: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings a process of the service builds, from its environment alone."""
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    for name, value in service_env(service).items():
        if name.startswith(ENV_PREFIX):
            monkeypatch.setenv(name, value)
    return load_settings()


def parse_cli(argv: list[str]) -> Any:
    """Parse argv with the real `ragline` command (options, types, ranges), without running it."""
    assert argv[0] == "ragline", f"not a ragline command: {argv}"
    commands = get_command(cli_app).commands  # type: ignore[attr-defined]
    name, *args = argv[1:]
    assert name in commands, f"`ragline {name}` does not exist (known: {sorted(commands)})"
    return commands[name].make_context(name, args)


def test_the_expected_services_are_there(services: dict[str, dict[str, Any]]) -> None:
    assert {"opensearch", "redis", *RAGLINE_SERVICES} <= set(services)


def test_every_ragline_variable_is_a_real_setting() -> None:
    known = setting_names() | {CONFIG_FILE_ENV}
    for path in (COMPOSE_FILE, DOCKERFILE):
        named = set(RAGLINE_NAME.findall(path.read_text()))
        assert named, f"{path.name} names no RAGLINE_* variable"
        unknown = named - known
        assert not unknown, f"{path.name} names variables no setting reads: {sorted(unknown)}"


def test_a_renamed_setting_would_be_caught() -> None:
    names = setting_names()
    assert "RAGLINE_OPENSEARCH__URL" in names
    assert "RAGLINE_CELERY__WORKER_CONCURRENCY" in names
    assert "RAGLINE_OPENSEARCH__ADDRESS" not in names


@pytest.mark.parametrize("name", RAGLINE_SERVICES)
def test_ragline_services_reach_opensearch_and_redis_by_service_name(
    name: str, services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_of(services[name], monkeypatch)
    print(f"{name}: opensearch {settings.opensearch.url}, redis {settings.redis.url}")
    opensearch, redis = urlsplit(settings.opensearch.url), urlsplit(settings.redis.url)
    assert opensearch.hostname == "opensearch"
    assert redis.hostname == "redis"
    assert {opensearch.hostname, redis.hostname} <= set(services)


def test_api_and_workers_share_the_state_volume(
    services: dict[str, dict[str, Any]], compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The blob store (accepted bytes, stage artifacts) is under the state dir: the API writes
    # what the workers read, so every one of them must mount the same named volume there.
    sources = set()
    for name in RAGLINE_SERVICES:
        state_dir = str(settings_of(services[name], monkeypatch).state_dir)
        mounted = {
            volume.split(":")[0] for volume in services[name]["volumes"] if volume.split(":")[1] == state_dir
        }
        assert len(mounted) == 1, f"{name} mounts nothing at its state dir {state_dir}"
        sources |= mounted
    assert len(sources) == 1
    assert sources <= set(compose["volumes"]), "the state dir must be a named volume"


def test_api_listens_on_the_published_port(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    api = services["api"]
    settings = settings_of(api, monkeypatch)
    assert settings.api.host == "0.0.0.0"  # noqa: S104  (inside the container; published on loopback)
    context = parse_cli(command(api))
    port = context.params.get("port") or settings.api.port
    published = [interpolate(p) for p in api["ports"]]
    assert any(p.endswith(f":{port}") for p in published), (port, published)


@pytest.mark.parametrize("name", [*RAGLINE_SERVICES, "opensearch", "redis"])
def test_ports_are_published_on_loopback_only(name: str, services: dict[str, dict[str, Any]]) -> None:
    for port in services[name].get("ports", []):
        if isinstance(port, dict):
            assert port.get("host_ip") == "127.0.0.1", port
        else:
            assert interpolate(str(port)).startswith("127.0.0.1:"), port


@pytest.mark.parametrize("name", WORKER_SERVICES)
def test_workers_can_be_scaled(name: str, services: dict[str, dict[str, Any]]) -> None:
    # `docker compose up --scale worker=N` fails on a fixed container name or a published port.
    assert "container_name" not in services[name]
    assert "ports" not in services[name]


def test_redis_keeps_an_append_only_file(services: dict[str, dict[str, Any]]) -> None:
    redis = services["redis"]
    argv = command(redis)
    assert argv[argv.index("--appendonly") + 1] == "yes", argv
    policy = argv[argv.index("--maxmemory-policy") + 1] if "--maxmemory-policy" in argv else "noeviction"
    # Evicting keys without a TTL would drop queued tasks.
    assert policy in ("noeviction", "volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl")
    assert any(volume.endswith(":/data") for volume in redis["volumes"])


def test_opensearch_matches_the_local_stack(services: dict[str, dict[str, Any]]) -> None:
    # The official image ships the k-NN plugin with its Lucene engine (there since 2.2), the
    # engine every chunk mapping names; the local stack runs the same version built from Maven
    # Central, where Lucene is the only engine that works, so the two must not drift apart.
    opensearch = services["opensearch"]
    repository, _, tag = opensearch["image"].partition(":")
    assert repository == "opensearchproject/opensearch"
    script = (DEPLOY / "local" / "opensearch.sh").read_text()
    local = re.search(r"^VERSION=\$\{RAGLINE_OPENSEARCH_VERSION:-([0-9.]+)\}", script, re.M)
    assert local, "deploy/local/opensearch.sh no longer sets its default version this way"
    print(f"compose image {tag}, local stack {local.group(1)}")
    assert tag.split(".")[:2] == local.group(1).split(".")[:2]
    assert tuple(int(part) for part in tag.split(".")[:2]) >= (2, 2)
    engines = set(re.findall(r'"engine":\s*"(\w+)"', Path(schema.__file__).read_text()))
    assert engines == {"lucene"}, engines
    env = service_env(opensearch)
    assert env["discovery.type"] == "single-node"
    assert env["bootstrap.memory_lock"] == "true"
    assert opensearch["ulimits"]["memlock"] == {"soft": -1, "hard": -1}
    assert "healthcheck" in opensearch


@pytest.mark.parametrize("name", RAGLINE_SERVICES)
def test_service_commands_exist_in_the_cli(name: str, services: dict[str, dict[str, Any]]) -> None:
    argv = command(services[name])
    context = parse_cli(argv)
    print(f"{name}: {shlex.join(argv)}")
    if context.command.name == "worker":
        queues = context.params["queues"].split(",")
        assert set(queues) <= set(Settings().celery.queues), queues


def test_image_command_exists_in_the_cli() -> None:
    argv = exec_form("ENTRYPOINT") + exec_form("CMD")
    parse_cli(argv[argv.index("ragline") :])


def test_image_runs_offline_as_non_root() -> None:
    env = image_env()
    assert env["HF_HUB_OFFLINE"] == "1"
    users = [rest for keyword, rest in dockerfile_instructions() if keyword == "USER"]
    assert users, "the image must switch to an unprivileged user"
    assert users[-1].split(":")[0] not in ("root", "0")


def test_image_installs_the_system_packages_of_the_local_setup() -> None:
    setup = (DEPLOY / "local" / "setup.sh").read_text()
    listed = re.search(r"^APT_PACKAGES=\(([^)]*)\)", setup, re.M)
    assert listed, "deploy/local/setup.sh no longer lists APT_PACKAGES"
    runs = " ".join(rest for keyword, rest in dockerfile_instructions() if keyword == "RUN").split()
    # redis-server is the local stack's broker; in compose Redis is its own service.
    missing = [p for p in listed.group(1).split() if p != "redis-server" and p not in runs]
    assert not missing, f"deploy/Dockerfile does not install {missing}"


def test_build_context_keeps_what_pip_needs() -> None:
    ignore = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    copied = [rest.split()[:-1] for keyword, rest in dockerfile_instructions() if keyword == "COPY"]
    for source in (s for sources in copied for s in sources):
        assert f"!{source.rstrip('/')}/" in ignore or f"!{source}" in ignore, source
        assert Path(REPO_ROOT / source).exists(), source


def test_image_copies_every_package_the_wheel_ships() -> None:
    import tomllib

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = {
        s.rstrip("/")
        for keyword, rest in dockerfile_instructions()
        if keyword == "COPY"
        for s in rest.split()[:-1]
    }
    assert packages <= copied, f"deploy/Dockerfile does not copy {sorted(packages - copied)}"


def test_image_installs_the_server_extra() -> None:
    runs = " ".join(rest for keyword, rest in dockerfile_instructions() if keyword == "RUN")
    assert "['optional-dependencies']['server']" in runs, "the image must install the server's dependencies"
