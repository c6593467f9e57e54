"""A server's own value is never replaced without a word (issue 29).

On a 2-CPU box the catalogue's range for max_parallel_workers_per_gather is 0..cpus//2 = 0..1,
and the server runs 2. The session once started from a clamped 1, recommended "no change"
(its conf export listed the knob unchanged) while best_config in the API held 1. Here a
session runs on the simulated target (tests/app/runs/fake.py: PostgreSQL 15's real
pg_settings rows, max_parallel_workers_per_gather = 2) and every view of its result, the
API's best_config, the exports and what apply-best changes, must agree on the server's 2.
"""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient

from app.main import create_app
from app.models import Target
from app.sessions.apply import recommended_changes
from app.settings import Settings
from tests.app.runs.fake import FakeEnv, add_session, add_target, make_db, run_session
from tests.optimizer.sim import flat_surface

KNOB = "max_parallel_workers_per_gather"
WORKLOAD = {"builtin": "tpcb-like", "scale": 1, "clients": 2, "duration_s": 20, "warmup_s": 2}


def test_best_config_exports_and_apply_best_agree_on_the_servers_own_value(
    tmp_path: Path,
) -> None:
    db = make_db(tmp_path)
    surface = flat_surface()  # nothing helps: the honest answer is the server's own config
    tid = add_target(db, surface)
    with db.session() as s:
        t = s.get(Target, tid)
        assert t is not None
        t.cpus = 2  # the catalogue's range is 0..1 here
    sid = add_session(
        db,
        tid,
        {
            "workload": WORKLOAD,
            "knobs": [KNOB, "work_mem"],
            "hints": False,
            "max_trials": 12,
            "seed": 2,
            "on_finish": "apply_best",
        },
    )
    env = FakeEnv(surface, seed=2)
    sess = run_session(db, tmp_path, sid, env)
    assert sess.status == "succeeded", (sess.error, sess.notes)
    assert sess.start_config is not None
    assert sess.best_config is not None
    assert sess.start_config[KNOB] == "2"  # the server's own, not a clamped 1
    # every trial's config holds a value the range allows, the baseline the server's own
    assert env.fake_target.applied[0][KNOB] == "2"
    # apply_best at the end changed nothing the session did not claim
    assert env.fake_target.settings.get(KNOB, "2") == sess.best_config[KNOB]
    changes = recommended_changes(sess)

    settings = Settings(database_url=db.url, work_dir=tmp_path, run_scheduler=False)
    with TestClient(create_app(settings)) as api:
        got = api.get(f"/api/v1/sessions/{sid}").json()
        conf = api.get(f"/api/v1/sessions/{sid}/config", params={"format": "conf"}).text
        doc = json.loads(api.get(f"/api/v1/sessions/{sid}/config", params={"format": "json"}).text)
    best = got["best_config"]
    assert best[KNOB] == sess.best_config[KNOB]
    # one config: the API's best, the JSON export's recommendation, and apply-best's changes
    assert doc["recommended"][KNOB] == best[KNOB]
    assert doc["original"][KNOB] == "2"
    changed_in_conf = {
        line.split(" = ")[0] for line in conf.splitlines() if " = " in line and line[0] != "#"
    }
    assert changed_in_conf == set(changes)
    for name, value in best.items():
        if name in changes:
            assert changes[name] == value
        else:  # unchanged: the best holds the server's own value
            assert value == got["start_config"][name]
    db.dispose()
