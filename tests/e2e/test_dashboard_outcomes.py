"""A session page for each outcome, in Chromium: confirmed gain, no change, unconfirmed,
failed. Each page must say in one plain paragraph what was found, how sure it is and what
to do next, show one figure in the objective's units and offer Apply only where there is
something to apply.

The four sessions run on the simulated target (tests/app/runs/fake.py: the real session
loop, optimizer and metadata DB; a response surface instead of PostgreSQL), so each ends
in its outcome by what the code decides, not by what a loaded host measured: with real
2 s runs, a no-op once ended "not-credible" on a loaded CI host. The pages are then served
by the real app. The session loop on real clusters is tested in tests/app/api and
tests/e2e/test_dashboard.py.

The screenshots are the manual's (docs/getting-started.md): with DOCS_SCREENSHOTS=docs/img
this test writes them there; otherwise into its temporary directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import sync_playwright

from app.db import Database
from app.models import Target
from app.settings import Settings
from tests.app.runs.fake import FakeEnv, Faults, add_session, add_target, make_db, run_session
from tests.e2e.test_dashboard import CHROMIUM, CHROMIUM_ARGS, Server
from tests.optimizer.sim import Surface, flat_surface, reporting_surface

WORKLOAD = {"builtin": "tpcb-like", "scale": 1, "clients": 2, "duration_s": 20, "warmup_s": 2}
# outcome -> the surface, the session's request and what goes wrong
SESSIONS: dict[str, tuple[Surface, dict[str, Any], Faults]] = {
    # work_mem 16MB: +44% on this surface, kept and confirmed by the final check
    "confirmed": (reporting_surface(), {"knobs": ["work_mem"], "hints": False,
                                        "max_trials": 30, "seed": 3}, Faults()),
    # knobs that do nothing: no change
    "no-change": (flat_surface(), {"knobs": ["shared_buffers", "max_wal_size"],
                                   "hints": False, "max_trials": 20, "seed": 5}, Faults()),
    # the same gain, but no final check: unconfirmed
    "unconfirmed": (reporting_surface(), {"knobs": ["work_mem"], "hints": False,
                                          "max_trials": 30, "final_check_runs": 0,
                                          "seed": 3}, Faults()),
    # pgbench fails in the baseline
    "failed": (reporting_surface(), {"knobs": ["work_mem"], "max_trials": 11, "seed": 3},
               Faults(fail={1, 2, 3})),
}  # fmt: skip
SAYS = {
    "confirmed": "Found a better configuration",
    "no-change": "No change recommended",
    "unconfirmed": "Unconfirmed:",
    "failed": "The session failed",
}


def _sessions(db: Database, tmp: Path) -> tuple[dict[str, int], dict[str, dict[str, Any]]]:
    """Each outcome's session, run to its end on the simulated target: ids and rows."""
    ids: dict[str, int] = {}
    final: dict[str, dict[str, Any]] = {}
    for outcome, (surface, body, faults) in SESSIONS.items():
        tid = add_target(db, surface)
        with db.session() as s:  # the name a user would give it, on the screenshot
            target = s.get(Target, tid)
            assert target is not None
            target.name = f"staging-{outcome}"
        sid = add_session(db, tid, {"workload": WORKLOAD, **body})
        seed = int(body["seed"])
        sess = run_session(db, tmp, sid, FakeEnv(surface, seed=seed, faults=faults))
        ids[outcome] = sid
        final[outcome] = {"status": sess.status, "gain_status": sess.gain_status}
    return ids, final


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="knobtune-outcomes-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.timeout(300)
def test_a_session_page_for_each_outcome(work: Path, tmp_path: Path) -> None:
    shots = Path(os.environ.get("DOCS_SCREENSHOTS") or tmp_path)
    db = make_db(tmp_path, work_dir=work)  # the service below runs on work: its key
    try:
        ids, final = _sessions(db, work)
    finally:
        db.dispose()
    assert final["confirmed"] == {"status": "succeeded", "gain_status": "confirmed"}, final
    assert final["no-change"]["gain_status"] in ("none", "no-change"), final["no-change"]
    assert final["unconfirmed"]["gain_status"] == "unconfirmed", final["unconfirmed"]
    assert final["failed"]["status"] == "failed", final["failed"]
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'meta.db'}", work_dir=work, poll_seconds=0.3
    )
    with Server(settings) as server:
        for sid in ids.values():  # served as the API reports them
            assert httpx.get(f"{server.url}/api/v1/sessions/{sid}", timeout=30).is_success
        _pages(server, ids, shots)


def _pages(server: Server, ids: dict[str, int], shots: Path) -> None:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1180, "height": 1250})
        for outcome, sid in ids.items():
            page.goto(f"{server.url}/sessions/{sid}")
            summary = page.inner_text("#summary")
            assert summary.startswith(SAYS[outcome]), (outcome, summary)
            assert "Next:" in summary, summary  # what to do next, every time
            result = page.inner_text("#gain")
            if outcome in ("confirmed", "unconfirmed"):
                # one figure in the objective's units, one sign
                assert result.startswith("throughput +"), result
                assert result.count("%") == 1, result
            if outcome == "no-change":
                assert result == "no change"
                # and how small an effect the runs could have shown: not "no effect"
                assert "What these runs could show:" in summary, summary
            apply = page.locator("#apply-button").count()
            assert apply == (1 if outcome in ("confirmed", "unconfirmed") else 0), outcome
            page.screenshot(path=str(shots / f"session-{outcome}.png"))
        browser.close()
    for outcome in SESSIONS:
        assert (shots / f"session-{outcome}.png").stat().st_size > 10_000
