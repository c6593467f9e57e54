"""Issue 29, part 3, at the session level on the simulated target (tests/app/runs/fake.py).

The runs report the server's counters (what app/postgres/pgbench.py stores in
trials.metrics); the loop must: order the walk from the baseline's counters, set a
checkpoint knob aside on runs shorter than its checkpoint cycle (a note naming the run
length, never "no effect", in the notes and the exports), judge it on long runs, show the
counters in the trial API, and resume by replay to the same walk (the counters come back
from the stored trials). Real PostgreSQL: tests/app/runs/test_counters_real.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.db import Database
from app.models import Trial
from app.sessions.export import export
from app.sessions.service import trial_out, trial_rows
from app.sessions.store import SessionStore
from optimizer.knobs import Config
from tests.app.runs.fake import FakeEnv, Faults, add_session, add_target, make_db, run_session
from tests.optimizer.sim import oltp_surface

MB = 1024.0 * 1024.0


@pytest.fixture
def db(tmp_path: Path) -> Any:
    d = make_db(tmp_path)
    yield d
    d.dispose()


def counters(window_s: float) -> Any:
    """3 MB/s of WAL, a fifth of the blocks read from outside shared_buffers, no checkpoint."""

    def of(config: Config) -> dict[str, float]:
        return {
            "seconds": window_s,
            "wal_bytes": 3 * MB * window_s,
            "wal_fpi": 100.0,
            "wal_records": 1000.0,
            "checkpoints_timed": 0.0,
            "checkpoints_req": 0.0,
            "buffers_checkpoint": 0.0,
            "buffers_clean": 0.0,
            "buffers_backend": 50.0,
            "blks_read": 2000.0,
            "blks_hit": 8000.0,
            "temp_files": 0.0,
            "temp_bytes": 0.0,
        }

    return of


def _session(db: Database, duration_s: int, **body: Any) -> int:
    s = oltp_surface()
    wl = {"builtin": "tpcb-like", "scale": 1, "clients": 2, "duration_s": duration_s,
          "warmup_s": 2}  # fmt: skip
    body = {"knobs": ["max_wal_size", "shared_buffers"], "hints": False, "max_trials": 60,
            "seed": 4, **body}  # fmt: skip
    return add_session(db, add_target(db, s), {"workload": wl, **body})


def trials_of(db: Database, sid: int) -> list[Trial]:
    return SessionStore(db, sid, owner=None).stored_trials()


def test_short_runs_set_max_wal_size_aside_and_order_the_walk(db: Database, tmp_path: Path) -> None:
    # a budget that holds the short walk but not the long runs max_wal_size would need
    sid = _session(db, 30, time_budget_s=1500)
    env = FakeEnv(oltp_surface(), seed=4, metrics=counters(28))
    sess = run_session(db, tmp_path, sid, env)
    assert sess.status == "succeeded", (sess.error, sess.notes)
    trials = trials_of(db, sid)
    # not one run spent on max_wal_size; shared_buffers tuned first
    assert all(t.knob != "max_wal_size" for t in trials)
    assert trials[2].knob == "shared_buffers"
    order = next(n for n in sess.notes if n.startswith("search order from the baseline"))
    assert "shared_buffers: 20.0% of blocks read from outside shared_buffers, tried first" in order
    aside = [n for n in sess.notes if n.startswith("max_wal_size not judged")]
    # the first step (x4: 4GB) has the longer cycle: the 5 min timeout comes first
    assert len(aside) == 1
    assert aside[0].startswith(
        "max_wal_size not judged: at 3.0 MB/s of WAL a checkpoint comes every 5 min, "
        "and 28 s runs cannot show it; give duration_s >= 302"
    )
    # ... and the plan said why the long runs did not start: the budget they need
    assert any(n.startswith("plan: 2 knob(s) on runs of 28 s") for n in sess.notes)
    assert any(n.startswith("long runs not started: max_wal_size") for n in sess.notes)
    assert not any("no effect" in n for n in sess.notes)
    # the counters in the trial API and on the dashboard's rows
    out = trial_out(trials[0])
    assert out.metrics["wal_bytes"] == 3 * MB * 28
    assert out.io is not None
    assert out.io.startswith("WAL 3.0 MB/s, FPI 10% | ckpt 0 timed 0 req")
    assert trial_rows(db, sid)[0]["io"] == out.io
    # the exports: the set-aside note, the I/O lines
    conf = export(db, sid, "conf")
    assert "# unchanged, set aside: max_wal_size not judged: at 3.0 MB/s" in conf
    assert "server I/O, start config" in conf
    assert "no effect" not in conf
    assert '"not_judged": "max_wal_size not judged' in export(db, sid, "json")


def test_a_budget_that_holds_them_gives_set_aside_knobs_long_runs(
    db: Database, tmp_path: Path
) -> None:
    # 28 s runs show no checkpoint; after the short walk max_wal_size is judged on runs of
    # a whole 5-minute cycle, because the 2-hour budget holds them
    sid = _session(db, 30, time_budget_s=7200)
    sess = run_session(db, tmp_path, sid, FakeEnv(oltp_surface(), seed=4, metrics=counters(28)))
    assert sess.status == "succeeded", (sess.error, sess.notes)
    assert any(n.startswith("long runs: max_wal_size on runs of 5 min") for n in sess.notes)
    assert any(t.knob == "max_wal_size" for t in trials_of(db, sid))
    # judged, so the exports no longer call it set aside (the note says why it waited)
    assert '"not_judged": "max_wal_size not judged' not in export(db, sid, "json")


def test_long_runs_judge_it(db: Database, tmp_path: Path) -> None:
    sid = _session(db, 302)  # the 5 min cycle fits in a 300 s window
    sess = run_session(db, tmp_path, sid, FakeEnv(oltp_surface(), seed=4, metrics=counters(300)))
    assert sess.status == "succeeded", (sess.error, sess.notes)
    assert not any("not judged" in n for n in sess.notes)
    assert any(t.knob == "max_wal_size" for t in trials_of(db, sid))


def test_a_resumed_session_replays_the_counters_to_the_same_walk(
    db: Database, tmp_path: Path
) -> None:
    plain = _session(db, 30)
    run_session(db, tmp_path, plain, FakeEnv(oltp_surface(), seed=4, metrics=counters(28)))
    crashed = _session(db, 30)
    env = FakeEnv(oltp_surface(), seed=4, metrics=counters(28), faults=Faults(crash=5))
    run_session(db, tmp_path, crashed, env)
    with db.session() as s:
        from app.models import TuningSession

        r = s.get(TuningSession, crashed)
        assert r is not None
        r.lease_owner = "other"
    env = FakeEnv(oltp_surface(), seed=4, metrics=counters(28))
    sess = run_session(db, tmp_path, crashed, env, owner="other")
    assert sess.status == "succeeded", (sess.error, sess.notes)
    a, b = trials_of(db, plain), trials_of(db, crashed)
    assert [(t.knob, t.value, t.role) for t in a] == [(t.knob, t.value, t.role) for t in b]
    # each note once, the resumed process did not repeat them
    assert sum(n.startswith("max_wal_size not judged") for n in sess.notes) == 1
    assert sum(n.startswith("search order") for n in sess.notes) == 1


def test_kept_hints_reorder_the_walk_and_the_session_notes_it(db: Database, tmp_path: Path) -> None:
    """The start config spills nothing; the hints' config does (its random_page_cost of 1.1
    changes the plans, as on TPC-H): once the hints are kept, work_mem moves from last to
    first, and the notes say so once."""
    base = counters(28)

    def spilling(config: Config) -> dict[str, float]:
        spills = str(config.get("random_page_cost", "4")) != "4"
        return {**base(config), "temp_files": 9.0 if spills else 0.0}

    knobs = ["shared_buffers", "random_page_cost", "work_mem"]
    sid = _session(db, 30, knobs=knobs, hints=True, max_trials=40)
    env = FakeEnv(oltp_surface(), seed=4, metrics=spilling)
    sess = run_session(db, tmp_path, sid, env)
    assert sess.status == "succeeded", (sess.error, sess.notes)
    orders = [n for n in sess.notes if n.startswith("search order")]
    assert len(orders) == 2, sess.notes
    assert (
        "work_mem: no sort or hash spilled to a temp file in the baseline, tried last"
        in (orders[0])
    )
    assert orders[1].startswith("search order after the hints were kept, from their runs: ")
    # two runs of the hints' config, 9 temp files each
    assert "work_mem: 18 temp files in the hints' config, tried first" in orders[1]
    # shared_buffers (busy both times) first, then work_mem, then random_page_cost
    one_at_a_time = [t.knob for t in trials_of(db, sid) if t.knob and t.role == "candidate"]
    firsts = list(dict.fromkeys(one_at_a_time))
    assert firsts[:2] == ["shared_buffers", "work_mem"], one_at_a_time
