"""`--json` on status, sessions and targets: the REST API's responses as they are (the same
fields), passwords masked as the API masks them, on a session with a real outcome."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.cli.shared import connect
from app.db import utcnow
from app.models import Target
from tests.app.cli.world import World
from tests.optimizer.sim import reporting_surface

SECRET = "s3cret-pw"


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    w = World(tmp_path, monkeypatch, reporting_surface())
    with w.db.session() as s:  # a server with a password in its DSN, both forms
        for name, dsn in (
            ("uri", f"postgresql://admin:{SECRET}@db5.example.com:5432/shop"),
            ("kv", f"host=db6.example.com user=admin password={SECRET} dbname=shop"),
        ):
            s.add(Target(name=name, dsn=dsn, probe={}, created_at=utcnow()))
    assert w.tune("--knobs", "work_mem", "--no-hints", "--max-trials", "30", "--seed", "3") == 0
    return w


def _api(world: World, path: str, **params: Any) -> Any:
    with connect(None, None, database_url=world.url, run_scheduler=False) as api:
        return api.call("GET", path, params=params)


def _json_out(world: World, capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    capsys.readouterr()
    assert world.cli(*args) == 0
    out = capsys.readouterr().out
    assert SECRET not in out
    return json.loads(out)


def test_status_json_is_the_apis_session(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json_out(world, capsys, "status", "1", "--json")
    assert doc == _api(world, "/api/v1/sessions/1")
    assert doc["outcome"] == "confirmed"
    assert doc["status"] == "succeeded"
    assert doc["summary"].startswith("Found a better configuration")


def test_sessions_json_is_the_apis_list(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json_out(world, capsys, "sessions", "--json")
    assert doc == _api(world, "/api/v1/sessions", limit=20)
    assert [s["id"] for s in doc] == [1]
    assert doc[0]["outcome"] == "confirmed"


def test_targets_json_masks_passwords_as_the_api_does(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    listed = _json_out(world, capsys, "targets", "list", "--json")
    assert listed == _api(world, "/api/v1/targets")
    by_name = {t["name"]: t for t in listed}
    assert set(by_name) == {world.target, "uri", "kv"}
    assert "db5.example.com" in by_name["uri"]["dsn"]
    assert "db6.example.com" in by_name["kv"]["dsn"]
    # `targets --json list` (the flag before the action) is the same
    assert _json_out(world, capsys, "targets", "--json", "list") == listed
    # without --json: the table, masked the same way
    capsys.readouterr()
    assert world.cli("targets", "list") == 0
    table = capsys.readouterr().out
    assert SECRET not in table
    assert by_name["uri"]["dsn"] in table
