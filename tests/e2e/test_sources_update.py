"""A source changed after it was added, over REST, MCP and the CLI: its name, its schedule and its
deletion guard, which the next run then keeps to. What it reads cannot change."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from services.cli.main import app
from tests.e2e.helpers import Server, call, http_session
from tests.e2e.sources import add, counts, documents, new_kb, sync, wait_run

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def kb(server: Server) -> Iterator[str]:
    yield from new_kb(server, "srcu")


def test_a_lowered_deletion_guard_holds_the_next_run(server: Server, folder: Path, kb: str) -> None:
    for n in range(5):
        (folder / f"page{n}.txt").write_text(f"Page {n} of the tide tables, with the puffin count.")
    with server.client("a_admin") as client:
        add(client, kb, {"type": "folder", "source_id": "tides", "settings": {"path": str(folder)}})
        assert counts(sync(client, kb, "tides")) == {"created": 5}

        changed = client.patch(
            f"/v1/kbs/{kb}/sources/tides", json={"max_deleted_share": 0.2, "name": "Tides"}
        )
        assert changed.status_code == 200, changed.text
        assert (changed.json()["max_deleted_share"], changed.json()["name"]) == (0.2, "Tides")
        assert changed.json()["settings"]["path"] == str(folder)  # untouched
        assert client.get(f"/v1/kbs/{kb}/sources/tides").json()["max_deleted_share"] == 0.2

        # 2 of 5 is within the default half, and over the fifth it was lowered to.
        (folder / "page0.txt").unlink()
        (folder / "page1.txt").unlink()
        refused = sync(client, kb, "tides")
        assert (refused["status"], refused["error"]["code"]) == ("failed", "CONFLICT"), refused
        assert "max_deleted_share (0.2)" in refused["error"]["message"]
        assert len(documents(client, kb)) == 5

        # Raised again, the share applies to later runs; the deletions held stay held.
        assert client.patch(f"/v1/kbs/{kb}/sources/tides", json={"max_deleted_share": 1}).status_code == 200
        held = sync(client, kb, "tides")
        assert (held["status"], held["error"]["code"]) == ("failed", "CONFLICT"), held
        assert "held" in held["error"]["message"]
        allowed = client.post(f"/v1/kbs/{kb}/sources/tides/sync", params={"allow_deletions": "true"})
        assert counts(wait_run(client, kb, "tides", allowed.json()["run_id"])) == {
            "deleted": 2,
            "unchanged": 3,
        }


def test_a_schedule_is_set_and_stopped(server: Server, folder: Path, kb: str) -> None:
    (folder / "a.txt").write_text("The lighthouse keeper's log.")
    with server.client("a_admin") as client:
        add(client, kb, {"type": "folder", "source_id": "log", "settings": {"path": str(folder)}})
        assert client.get(f"/v1/kbs/{kb}/sources/log").json()["next_run_at"] is None
        ended = sync(client, kb, "log")
        finished = datetime.fromisoformat(ended["finished_at"])

        scheduled = client.patch(f"/v1/kbs/{kb}/sources/log", json={"schedule": {"interval_s": 3600}})
        assert scheduled.status_code == 200, scheduled.text
        assert scheduled.json()["schedule"] == {"interval_s": 3600}
        next_run = datetime.fromisoformat(scheduled.json()["next_run_at"])
        assert (next_run - finished).total_seconds() == pytest.approx(3600, abs=1)
        assert next_run > datetime.now(UTC)

        # Another field alone leaves the schedule as it is; null stops it.
        renamed = client.patch(f"/v1/kbs/{kb}/sources/log", json={"name": "Log"}).json()
        assert (renamed["schedule"], renamed["next_run_at"]) == (
            {"interval_s": 3600},
            scheduled.json()["next_run_at"],
        )
        stopped = client.patch(f"/v1/kbs/{kb}/sources/log", json={"schedule": None}).json()
        assert (stopped["schedule"], stopped["next_run_at"]) == (None, None)


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"max_deleted_share": True}, 422),  # a JSON true read as 1 would turn the guard off
        ({"max_deleted_share": 1.5}, 422),
        ({"schedule": {"interval_s": 5}}, 422),
        ({"settings": {"path": "/"}}, 422),  # what it reads is fixed
        ({"type": "web"}, 422),
    ],
)
def test_a_change_it_cannot_take_is_refused(
    server: Server, folder: Path, kb: str, body: dict[str, object], status: int
) -> None:
    with server.client("a_admin") as client:
        add(client, kb, {"type": "folder", "source_id": "fixed", "settings": {"path": str(folder)}})
        refused = client.patch(f"/v1/kbs/{kb}/sources/fixed", json=body)
        assert refused.status_code == status, refused.text
        assert client.get(f"/v1/kbs/{kb}/sources/fixed").json()["max_deleted_share"] == 0.5


def test_only_an_admin_of_the_tenant_changes_a_source(server: Server, folder: Path, kb: str) -> None:
    with server.client("a_admin") as client:
        add(client, kb, {"type": "folder", "source_id": "mine", "settings": {"path": str(folder)}})
    for key, status in (("a_read", 403), ("b_admin", 404)):
        with server.client(key) as other:
            response = other.patch(f"/v1/kbs/{kb}/sources/mine", json={"max_deleted_share": 1})
            assert response.status_code == status, (key, response.text)
    with server.client("a_admin") as client:
        assert client.patch(f"/v1/kbs/{kb}/sources/nobody", json={"name": "x"}).status_code == 404
        assert client.get(f"/v1/kbs/{kb}/sources/mine").json()["max_deleted_share"] == 0.5


async def test_an_agent_and_the_cli_change_a_source(server: Server, folder: Path, kb: str) -> None:
    with server.client("a_admin") as client:
        add(client, kb, {"type": "folder", "source_id": "shared", "settings": {"path": str(folder)}})
    async with http_session(server, "a_admin") as session:
        changed = await call(
            session, "update_source", kb_id=kb, source_id="shared", change={"max_deleted_share": 0.1}
        )
    assert changed["max_deleted_share"] == 0.1
    ran = CliRunner().invoke(
        app,
        [
            "source", "update", kb, "shared", "--every", "600", "--name", "Shared",
            "--server", server.url, "--api-key", server.keys["a_admin"],
        ],
    )  # fmt: skip
    assert ran.exit_code == 0, ran.output
    with server.client("a_admin") as client:
        shown = client.get(f"/v1/kbs/{kb}/sources/shared").json()
    assert (shown["name"], shown["schedule"], shown["max_deleted_share"]) == (
        "Shared",
        {"interval_s": 600},
        0.1,
    )

    remote = ["--server", server.url, "--api-key", server.keys["a_admin"]]
    stopped = CliRunner().invoke(app, ["source", "update", kb, "shared", "--no-schedule", *remote])
    assert stopped.exit_code == 0, stopped.output
    assert '"schedule": null' in stopped.output
    # The CLI says why the API refused a value, not only that the request was not valid.
    refused = CliRunner().invoke(app, ["source", "update", kb, "shared", "--every", "30", *remote])
    assert refused.exit_code == 1
    assert "schedule.interval_s: Input should be greater than or equal to 60" in refused.output
