"""Sandbox targets with hardware profiles, through the REST API: real sandboxes, real cgroups.

What a client sees (the profile, the detected memory and CPUs, 422s that say what to do),
and the lifecycle around the service: a restart of the server by the service's own path,
the service starting again (start_sandboxes), the target's removal.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.db import Database
from app.main import create_app
from app.models import Target
from app.postgres import cgroups
from app.postgres.cgroups import GIB, MIB, PROFILES, Cgroup
from app.postgres.sandbox import Sandbox, drop_cgroup
from app.settings import Settings
from app.targets.access import controller_for
from app.targets.probe_data import hardware_from
from app.targets.sandboxes import start_sandboxes
from optimizer.heuristic import pgtune
from tests.helpers import assert_in_cgroup, needs_cgroups

live = needs_cgroups


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    tmp = tmp_path_factory.mktemp("profiles")
    return Settings(database_url=f"sqlite:///{tmp / 'meta.db'}", work_dir=tmp, run_scheduler=False)


@pytest.fixture(scope="module")
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c
        for t in c.get("/api/v1/targets").json():  # whatever a failed test left
            c.delete(f"/api/v1/targets/{t['id']}", params={"history": "drop"})


def _row(client: TestClient, target_id: int) -> Target:
    db: Database = client.app.state.db  # type: ignore[attr-defined]
    with db.session() as s:
        row = s.get(Target, target_id)
        assert row is not None
        s.expunge(row)
        return row


def _names(client: TestClient) -> set[str]:
    return {t["name"] for t in client.get("/api/v1/targets").json()}


def _post(client: TestClient, name: str, sandbox: Any) -> Any:
    return client.post("/api/v1/targets", json={"name": name, "sandbox": sandbox})


# -- 422s before anything is made -------------------------------------------------------


@pytest.mark.parametrize(
    ("sandbox", "said"),
    [
        ({"memory": "1XB"}, "is not a size"),
        ({"memory": "-1GB"}, "positive"),
        ({"memory": "64MB"}, "at least '128MB'"),
        ({"memory": "64TB"}, "more than this host has"),
        ({"memory": "1GB", "disk_iops": -5}, "disk_iops must be a whole number"),
        ({"memory": "1GB", "disk_mbps": 10**12}, "disk_mbps must be a whole number"),
        ({"cpus": 4096}, "more than this host has"),
        ({"profile": "xl-metal"}, "no profile 'xl-metal'"),
        ({}, '"sandbox": true'),
        ({"memory": "1GB", "swap": "1GB"}, "Extra inputs"),
    ],
)
def test_invalid_profiles_are_422_with_what_to_give(
    client: TestClient, sandbox: dict[str, Any], said: str
) -> None:
    r = _post(client, "bad", sandbox)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert len(detail) == 1, detail  # the profile's own error, not "not a boolean" besides
    assert said in detail[0]["msg"]
    assert "bad" not in _names(client)


def test_no_cgroups_here_is_422_saying_so(
    client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cgroups, "CGROUP_ROOT", tmp_path)  # a host without cgroup controllers
    r = _post(client, "nocg", {"profile": "small"})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert "cannot be set up" in detail
    assert '"sandbox": true' in detail  # what to do instead
    assert "nocg" not in _names(client)


# -- the lifecycle ----------------------------------------------------------------------


@live
def test_profile_sandbox_lifecycle(client: TestClient, settings: Settings) -> None:
    r = _post(client, "small-vm", {"profile": "small", "disk_iops": 500})
    assert r.status_code == 201, r.text
    t = r.json()
    small = PROFILES["small"].limits
    assert t["sandbox_limits"] == {
        "profile": "small+",
        "memory_bytes": GIB,
        "disk_iops": 500,
        "disk_mbps": small.disk_mbps,
        "cpus": 1,
    }
    # The memory and CPUs the server really has: its cgroup's, not the host's 24 GiB.
    assert t["ram_bytes"] == GIB
    assert t["cpus"] == 1
    assert "cgroup" in (t["hardware_note"] or "")
    # ...and so the hints: PGTune's 25% of 1 GB, never of the host.
    hint = pgtune(hardware_from(t["ram_bytes"], t["cpus"]))["shared_buffers"]
    assert hint == "256MB"

    row = _row(client, t["id"])
    assert row.sandbox_dir is not None
    root = Path(row.sandbox_dir)
    cg = Cgroup.for_sandbox(root)
    mem = cgroups.CGROUP_ROOT / "memory" / cg.name / "memory.limit_in_bytes"
    assert int(mem.read_text()) == GIB
    sb = Sandbox.open(root)
    assert_in_cgroup(sb)

    # A restart by the service's own path (a postmaster knob, as a session applies it).
    ctl = controller_for(row, settings)
    snap = ctl.snapshot(["shared_buffers"])
    first = sb.postmaster_pids()
    res = ctl.apply({"shared_buffers": "64MB"})
    assert res.restarted
    assert sb.postmaster_pids().isdisjoint(first)
    assert_in_cgroup(sb)
    ctl.revert(snap)
    assert_in_cgroup(sb)

    # The service starts again after the host rebooted: the sandbox is down, its cgroup
    # gone. start_sandboxes() makes the cgroup from the stored profile and starts it inside.
    sb.stop()
    drop_cgroup(root)
    assert not cg.exists()
    start_sandboxes(client.app.state.db)  # type: ignore[attr-defined]
    assert int(mem.read_text()) == GIB
    assert_in_cgroup(sb, row.dsn)  # and a backend forked now

    # Removing the target removes its sandbox and its cgroup.
    assert client.delete(f"/api/v1/targets/{t['id']}").status_code == 204
    assert not root.exists()
    for c in ("memory", "blkio", "cpu"):
        assert not (cgroups.CGROUP_ROOT / c / cg.name).exists()


@live
def test_explicit_limits_and_a_declared_ram_above_the_limit(client: TestClient) -> None:
    r = client.post(
        "/api/v1/targets",
        json={"name": "tiny", "sandbox": {"memory": "256MB"}, "ram_bytes": 8 * GIB},
    )
    assert r.status_code == 422, r.text
    assert "0.25 GiB" in r.json()["detail"]
    assert "tiny" not in _names(client)

    r = _post(client, "tiny", {"memory": str(256 * MIB)})
    assert r.status_code == 201, r.text
    t = r.json()
    assert t["ram_bytes"] == 256 * MIB
    assert t["sandbox_limits"]["profile"] is None
    assert client.delete(f"/api/v1/targets/{t['id']}").status_code == 204


def test_profiles_are_listed(client: TestClient) -> None:
    r = client.get("/api/v1/profiles")
    assert r.status_code == 200
    names = [p["name"] for p in r.json()]
    assert names == list(PROFILES)
    assert all(p["models"] for p in r.json())


@live
def test_dashboard_form_registers_a_sandbox_with_a_profile(client: TestClient) -> None:
    page = client.get("/")
    assert 'name="profile"' in page.text
    assert "small: 1GB memory, 1 CPU, 1000 IOPS, 100 MB/s" in page.text
    form = {"name": "web-vm", "sandbox": "on", "profile": "micro", "sandbox_iops": "300"}
    r = client.post("/targets", data=form, follow_redirects=False)
    assert r.status_code == 303, r.text
    t = next(t for t in client.get("/api/v1/targets").json() if t["name"] == "web-vm")
    assert t["sandbox_limits"]["disk_iops"] == 300
    assert t["ram_bytes"] == 512 * MIB
    assert "micro+ (512MB memory, 1 CPU, 300 IOPS, 50 MB/s)" in client.get("/").text
    assert client.delete(f"/api/v1/targets/{t['id']}").status_code == 204


@pytest.mark.parametrize(
    ("form", "said"),
    [
        ({"sandbox": "on", "sandbox_memory": "1XB"}, "is not a size"),
        ({"sandbox": "on", "sandbox_iops": "lots"}, "disk_iops: a whole number"),
        ({"profile": "small"}, "tick Sandbox"),
    ],
)
def test_dashboard_form_profile_errors(client: TestClient, form: dict[str, str], said: str) -> None:
    r = client.post("/targets", data={"name": "web-bad", **form}, follow_redirects=False)
    assert r.status_code == 422
    assert said in r.text
    assert "web-bad" not in _names(client)


@live
def test_a_local_server_in_a_cgroup_registered_by_dsn_gets_the_limit(client: TestClient) -> None:
    """The issue's case: a local server in a memory cgroup of a few hundred MB, registered
    without ram_bytes. Its memory is the cgroup's, so its hints are too."""
    with Sandbox.create(limits=cgroups.Limits(memory_bytes=384 * MIB)) as sb:
        r = client.post("/api/v1/targets", json={"name": "capped-local", "dsn": sb.dsn})
        assert r.status_code == 201, r.text
        t = r.json()
        assert t["ram_bytes"] == 384 * MIB
        assert "memory.limit_in_bytes" in t["hardware_note"]
        assert pgtune(hardware_from(t["ram_bytes"], t["cpus"]))["shared_buffers"] == "96MB"
        assert client.delete(f"/api/v1/targets/{t['id']}").status_code == 204
