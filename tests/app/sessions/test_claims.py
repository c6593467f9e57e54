"""How sure a session's claimed gain is, wherever it appears (issue 14).

A budget that cannot hold the final check is refused up front, and a session whose check
was cut before it had both configs (here: cancelled in the middle) marks its gain
unconfirmed in the API, the three exports and the dashboard.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.postgres.sandbox import Sandbox
from tests.helpers import WORK_MEM_SQL, file_settings

SORT_WORKLOAD = {
    "builtin": None,
    "scripts": [{"sql": WORK_MEM_SQL}],
    "init": False,
    "clients": 2,
    "jobs": 1,
    "duration_s": 3,
    "warmup_s": 1,
}


@pytest.fixture(scope="module")
def target(client: TestClient) -> Any:
    with Sandbox.create() as sb:
        r = client.post("/api/v1/targets", json={"name": "claims", "dsn": sb.dsn})
        assert r.status_code == 201, r.text
        yield sb, r.json()["id"]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"max_trials": 10}, "give max_trials >= 11"),
        ({"max_trials": 6, "final_check_runs": 2}, "give max_trials >= 7"),
        ({"time_budget_s": 30}, "give time_budget_s >= 33"),
        ({"final_check_runs": 3}, "final_check_runs must be even"),
    ],
)
def test_a_budget_without_room_for_the_final_check_is_refused(
    client: TestClient, target: Any, extra: dict[str, Any], says: str
) -> None:
    body = {"target_id": target[1], "knobs": ["work_mem"], "workload": SORT_WORKLOAD, **extra}
    r = client.post("/api/v1/sessions", json=body)
    assert r.status_code == 422, r.text
    assert says in r.text


def test_a_cancelled_final_check_leaves_the_gain_unconfirmed_everywhere(
    client: TestClient, target: Any
) -> None:
    sb, tid = target
    before = file_settings(sb.dsn)
    # work_mem's hint makes this workload 16x faster: kept within the walk, then the check
    body = {"target_id": tid, "knobs": ["work_mem"], "workload": SORT_WORKLOAD, "max_trials": 11}
    r = client.post("/api/v1/sessions", json=body)
    assert r.status_code == 202, r.text
    sid = r.json()["id"]
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        s = client.get(f"/api/v1/sessions/{sid}").json()
        if s["status"] != "running" and s["status"] != "queued":
            raise AssertionError(f"the session ended before its final check: {s}")
        if s["phase"].startswith("final check"):
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"no final check began: {s}")
    assert client.post(f"/api/v1/sessions/{sid}/cancel").status_code == 202
    while (s := client.get(f"/api/v1/sessions/{sid}").json())["status"] == "running":
        time.sleep(0.3)
    assert s["status"] == "cancelled", s
    assert s["gain_status"] == "unconfirmed", s
    assert s["gain"] is not None, s
    assert s["best_config"]["work_mem"] != "4MB", s
    assert file_settings(sb.dsn) == before  # a cancel restores the target

    conf = client.get(f"/api/v1/sessions/{sid}/config").text
    sql = client.get(f"/api/v1/sessions/{sid}/config", params={"format": "sql"}).text
    js = client.get(f"/api/v1/sessions/{sid}/config", params={"format": "json"}).json()
    for text in (conf, sql):
        header = [line for line in text.splitlines() if "gain vs original" in line]
        assert len(header) == 1, text
        assert "UNCONFIRMED" in header[0], text
    assert js["gain_status"] == "unconfirmed"
    assert "UNCONFIRMED" in js["claim"]
    page = client.get(f"/sessions/{sid}").text
    assert 'id="gain-status"' in page
    assert "UNCONFIRMED" in page


def test_a_keep_decided_on_an_incumbent_rerun_is_the_candidates_in_the_export() -> None:
    from app.models import Trial
    from app.sessions.export import _verdict_rows
    from optimizer.render import Recommendation, render_conf

    def t(i: int, role: str, config: dict[str, str], **kw: Any) -> Trial:
        return Trial(index=i, role=role, config=config, **kw)

    start, best = {"work_mem": "4MB"}, {"work_mem": "28569kB"}
    trials = [
        t(1, "baseline", start),
        t(2, "baseline", start),
        t(3, "candidate", best, knob="work_mem", value="28569kB"),
        t(4, "incumbent", start),
        t(5, "incumbent", start, verdict="keep", gain=0.489),  # C I I: decided here
        t(6, "candidate", {"work_mem": "60MB"}, knob="work_mem", value="60MB", verdict="revert"),
    ]
    rows = _verdict_rows(trials, start)
    assert rows[2] == ("work_mem", "keep", 0.489)
    assert rows[4] == (None, None, None)
    rec = Recommendation.from_trials(original=start, recommended=best, trials=rows)
    assert "# work_mem: 4MB -> 28569kB (+48.9% measured, 2 trials)" in render_conf(rec)
