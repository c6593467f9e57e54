"""Issue 27's root fixes, as a user meets them: a workload's own defaults, scripts alone,
a service started in a private directory, exports that speak only of their own session."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.cli import build_parser
from app.cli.sessions import _session_body
from app.db import Database, utcnow
from app.main import create_app
from app.models import Sweep, TuningSession
from app.sessions.schemas import SessionIn
from app.settings import Settings
from app.workloads.schemas import WorkloadIn


# -- (1) a workload's own defaults; the CLI never overrides them ----------------------------
def test_tpch_runs_its_power_test_on_one_client_whatever_the_front_end() -> None:
    args = build_parser().parse_args(
        ["tune", "--target", "t", "--builtin", "tpch", "--scale", "0.2",
         "--objective", "query_time_geomean", "--duration", "40"]
    )  # fmt: skip
    body = SessionIn.model_validate(_session_body(args, 1))
    wl = body.workload
    assert (wl.clients, wl.jobs, wl.scale, wl.duration_s) == (1, 1, 0.2, 40)
    assert wl.warmup_s == 10  # TPC-H's own warm-up fits a 40 s run
    throughput = WorkloadIn(builtin="tpch", mode="throughput")
    assert throughput.clients == 2
    assert WorkloadIn(builtin="tpch").scale == 1  # scale factor 1, not pgbench's 10
    assert WorkloadIn().clients == 8  # pgbench's own
    # a short run the user asked for never gets a warm-up longer than itself
    assert WorkloadIn(duration_s=4).warmup_s == 1


def test_every_cli_option_says_what_it_is() -> None:
    parser = build_parser()
    subs = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    seen = 0
    for name, sub in subs.choices.items():  # type: ignore[attr-defined]
        for action in sub._actions:
            if action.dest in ("help", "action"):
                continue
            assert action.help, f"knobtune {name} {action.option_strings}: no help text"
            seen += 1
    assert seen > 60


# -- (3) scripts without builtin are the user's scripts only --------------------------------
def test_scripts_alone_run_alone_and_both_stay_possible() -> None:
    alone = WorkloadIn.model_validate({"scripts": [{"sql": "SELECT 1"}]})
    assert alone.builtin is None
    assert alone.init is False  # on the user's tables: knobtune creates none
    both = WorkloadIn.model_validate({"builtin": "tpcb-like", "scripts": [{"sql": "SELECT 1"}]})
    assert both.builtin == "tpcb-like"
    assert both.init is True
    assert WorkloadIn.model_validate({}).builtin == "tpcb-like"


# -- (2) a service started in a private directory still gets sandboxes ------------------------
@pytest.fixture
def private_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="knobtune-private-"))
    path.chmod(0o700)  # as /root, or mkdtemp's default
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes run as the postgres user only as root")
def test_sandbox_of_a_service_in_a_private_directory(private_dir: Path) -> None:
    settings = Settings(
        database_url=f"sqlite:///{private_dir / 'meta.db'}",
        work_dir=private_dir / ".knobtune",
        run_scheduler=False,
    )
    with TestClient(create_app(settings)) as c:
        r = c.post("/api/v1/targets", json={"name": "try-me", "sandbox": True})
        assert r.status_code == 201, r.text
        t = r.json()
        db: Database = c.app.state.db  # type: ignore[attr-defined]
        from app.models import Target

        with db.session() as s:
            row = s.get(Target, t["id"])
            assert row is not None
            assert row.sandbox_dir is not None
            root = Path(row.sandbox_dir)
        assert not root.is_relative_to(private_dir)  # somewhere the postgres user can enter
        assert root.parent.name.startswith("knobtune-sandboxes-")
        assert c.delete(f"/api/v1/targets/{t['id']}").status_code == 204
        assert not root.exists()
        assert root.parent.is_dir()
    # the service's shutdown removed the fallback directory its last sandbox had left empty
    assert not root.parent.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes run as the postgres user only as root")
def test_an_unreachable_sandbox_dir_names_the_setting(private_dir: Path) -> None:
    # The work dir is the service's own (made enter-only for the sandboxes below it); the
    # sandbox dir set here lies under another private directory, as under /root.
    closed = private_dir / "closed"
    closed.mkdir(mode=0o700)
    settings = Settings(
        database_url=f"sqlite:///{private_dir / 'meta.db'}",
        work_dir=private_dir / "work",
        sandbox_dir=closed / "sandboxes",
        run_scheduler=False,
    )
    with TestClient(create_app(settings)) as c:
        r = c.post("/api/v1/targets", json={"name": "try-me", "sandbox": True})
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert "KNOBTUNE_SANDBOX_DIR" in detail
    assert "pytest" not in detail
    assert "Sandbox.create" not in detail


# -- (5) exports speak only of their own session and target ----------------------------------
def _session(target_id: int, at: Any, workload: dict[str, Any]) -> TuningSession:
    return TuningSession(
        target_id=target_id, status="succeeded", phase="done", seed=1,
        request={"workload": workload, "objective": "query_time_geomean"},
        start_config={"work_mem": "4MB"}, best_config={"work_mem": "16MB"},
        gain=0.2, gain_status="confirmed", benchmark_s=1.0, notes=[], cancel_requested=False,
        attempts=1, created_at=at, started_at=at, finished_at=at + timedelta(minutes=5),
    )  # fmt: skip


def _sweep(target_id: int, at: Any, builtin: str) -> Sweep:
    return Sweep(
        target_id=target_id, status="succeeded", phase="succeeded",
        request={"builtin": builtin, "scale": 10, "scripts": None}, runs=[],
        result={"knee_clients": 4, "knee_tps": 900.0, "best_tps": 1000.0, "best_clients": 8,
                "pool_size": 4, "warnings": ["max_connections 100 is 25x the knee"]},
        knee_clients=4, best_clients=8, best_tps=1000.0, cancel_requested=False,
        created_at=at, started_at=at, finished_at=at,
    )  # fmt: skip


def test_an_export_speaks_only_of_its_own_session(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'meta.db'}", run_scheduler=False)
    with TestClient(create_app(settings)) as c:
        db: Database = c.app.state.db  # type: ignore[attr-defined]
        from app.models import Target

        now = utcnow()
        with db.session() as s:
            t = Target(name="t", dsn="host=x", ram_bytes=2**33, cpus=2, probe={}, created_at=now)
            s.add(t)
            s.flush()
            tpch = _session(t.id, now, {"builtin": "tpch", "scale": 0.2})
            tpcb = _session(t.id, now, {"builtin": "tpcb-like", "scale": 10, "scripts": None})
            s.add_all([tpch, tpcb])
            s.flush()
            # a TPC-B sweep after both sessions ended, then one before the TPC-B session's end
            s.add(_sweep(t.id, now + timedelta(hours=1), "tpcb-like"))
            s.add(_sweep(t.id, now + timedelta(minutes=1), "tpcb-like"))
            ids = (tpch.id, tpcb.id)
        tpch_conf = c.get(f"/api/v1/sessions/{ids[0]}/config").text
        tpcb_conf = c.get(f"/api/v1/sessions/{ids[1]}/config").text
    assert "sweep" not in tpch_conf.lower()  # another workload: nothing to say
    assert "WARNING (sweep)" in tpcb_conf  # its own workload, before it ended
    assert "sweep 2 (" in tpcb_conf  # the one before the session's end, not the later one
