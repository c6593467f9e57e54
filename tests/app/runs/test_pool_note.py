"""A kept shared_buffers is confirmed only on a warm pool (issue 29, part 2).

A session once kept host-sized shared_buffers at "+79.7%" on 30 s runs, before the pool
had filled; the OOM killer took the server minutes later. Every keep of shared_buffers
now says how full the pool was (pg_buffercache where it is installed, else the data's
size against the pool), and calls a keep on a cold pool unconfirmed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.postgres.target import PoolFill
from app.sessions.runner import pool_note
from tests.app.runs.fake import FakeEnv, add_session, add_target, make_db, run_session
from tests.optimizer.sim import oltp_surface

MB = 1 << 20
GB = 1 << 30


def test_the_note_says_how_full_the_pool_was() -> None:
    cold = pool_note("2GB", PoolFill(pool_bytes=2 * GB, used_bytes=246 * MB, data_bytes=3 * GB))
    assert cold is not None
    assert cold.startswith("shared_buffers=2GB kept on runs that filled 12% of the pool")
    assert "unconfirmed until the pool is warm" in cold
    # warm: full, or holding all the data
    assert pool_note("2GB", PoolFill(2 * GB, int(1.9 * GB), 3 * GB)) is None
    assert pool_note("2GB", PoolFill(2 * GB, 500 * MB, 520 * MB)) is None
    # not measurable: said so, with the bound the data's size gives
    big = pool_note("2GB", PoolFill(2 * GB, None, 3 * GB))
    assert big is not None
    assert "not measured" in big
    assert "unconfirmed until the pool is warm" in big
    small = pool_note("2GB", PoolFill(2 * GB, None, 512 * MB))
    assert small is not None
    assert "never fills beyond 25%" in small
    unknown = pool_note("2GB", None)
    assert unknown is not None
    assert "unconfirmed" in unknown


@pytest.fixture
def db(tmp_path: Path) -> Any:
    d = make_db(tmp_path)
    yield d
    d.dispose()


def test_a_session_that_keeps_shared_buffers_on_a_cold_pool_notes_it(
    db: Any, tmp_path: Path
) -> None:
    s = oltp_surface()  # shared_buffers is worth +45% here: the walk keeps a larger one
    sid = add_session(
        db,
        add_target(db, s),
        {
            "workload": {"builtin": "tpcb-like", "duration_s": 20, "warmup_s": 2},
            "knobs": ["shared_buffers"],
            "hints": False,
            "max_trials": 14,
            "seed": 3,
        },
    )
    env = FakeEnv(s, seed=3)
    env.fake_target.pool = PoolFill(pool_bytes=2 * GB, used_bytes=246 * MB, data_bytes=3 * GB)
    sess = run_session(db, tmp_path, sid, env)
    assert sess.status == "succeeded", sess.error
    notes = [str(n) for n in sess.notes if "shared_buffers=" in str(n) and "kept" in str(n)]
    assert notes, sess.notes
    # the pool is read after a run of the kept value; a keep decided on the incumbent's
    # run (another pool) says that its fill is unknown
    assert all("unconfirmed until the pool is warm" in n for n in notes), notes
    assert all(
        "filled 12% of the pool" in n or "the run that decided it was of another config" in n
        for n in notes
    ), notes
