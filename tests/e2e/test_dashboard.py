"""The web dashboard in real headless Chromium (Debian's /usr/bin/chromium, via Playwright).

The real service runs in a thread (uvicorn on a loopback port, with its scheduler),
tunes a real sandbox cluster registered through the dashboard's own form, with
real pgbench runs of 2 s. Also: auth (token header, login cookie) and the
query count of the pages (the dashboard must stay cheap under polling).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from playwright.sync_api import ConsoleMessage, Page, sync_playwright
from sqlalchemy import event

from app.db import Database, utcnow
from app.main import create_app
from app.models import Target, Trial, TuningSession
from app.postgres.sandbox import free_port
from app.settings import Settings
from tests.helpers import WORK_MEM_SQL

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
FINAL = ("succeeded", "failed", "cancelled")


class Server:
    """The app under uvicorn in a background thread (lifespan runs: migrations, scheduler)."""

    def __init__(self, settings: Settings) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            create_app(settings), host="127.0.0.1", port=self.port, log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise AssertionError("the service did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)


@pytest.fixture
def work_dir() -> Iterator[Path]:
    # Sandboxes run as the postgres OS user when we are root: pytest's tmp_path
    # is private to root, so the work dir lives in a world-traversable /tmp dir.
    path = Path(tempfile.mkdtemp(prefix="knobtune-dash-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def server(tmp_path: Path, work_dir: Path) -> Iterator[Server]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'meta.db'}",
        work_dir=work_dir,
        poll_seconds=0.3,
        lease_seconds=10,
    )
    with Server(settings) as srv:
        yield srv
        # Deleting the target stops and removes its managed sandbox cluster.
        for t in httpx.get(f"{srv.url}/api/v1/targets", timeout=10).json():
            httpx.delete(f"{srv.url}/api/v1/targets/{t['id']}?history=drop", timeout=60)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_dashboard_in_chromium(server: Server, tmp_path: Path) -> None:
    assert shutil.which(CHROMIUM), "install Debian's chromium: apt-get install chromium"
    api = httpx.Client(base_url=server.url, timeout=30)
    problems: list[str] = []

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            problems.append(f"console: {msg.text} ({msg.location})")

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        ctx = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
        page = ctx.new_page()
        page.on("console", on_console)
        page.on("pageerror", lambda err: problems.append(f"page error: {err}"))
        page.set_default_timeout(30_000)

        # An empty service: the index explains what to do first.
        page.goto(server.url + "/")
        assert "No sessions yet" in page.inner_text("#sessions-table")

        # Register a sandbox target through the form (creates a managed local cluster).
        page.fill("#target-form input[name=name]", "sandbox-e2e")
        page.check("#target-form input[name=sandbox]")
        page.click("#target-form button[type=submit]")
        page.wait_for_url("**/?target_id=*")
        assert "sandbox-e2e" in page.inner_text("#targets")

        # A form error is a clear message on the page, not a 500.
        fill_session_form(page, duration_s="2", warmup_s="2")
        with page.expect_response(lambda r: r.request.method == "POST") as resp:
            page.click("#session-form button[type=submit]")
        assert resp.value.status == 422
        assert "warmup_s (2) must be less than duration_s (2)" in page.inner_text(".error")

        # Start a real session; the browser lands on its page. The form says how long.
        fill_session_form(page, duration_s="2", warmup_s="1")
        assert "up to 11 runs × 2 s" in page.inner_text("#estimate")
        page.click("#session-form button[type=submit]")
        page.wait_for_url("**/sessions/*")
        sid = int(page.url.rstrip("/").rsplit("/", 1)[1])

        # Live view: the sparkline gets per-second samples while a benchmark runs.
        page.wait_for_function(
            "() => Number(document.getElementById('live-spark')?.dataset.samples || 0) > 0"
            " || ['succeeded', 'failed', 'cancelled'].includes("
            "document.getElementById('session')?.dataset.status)",
            timeout=60_000,
        )
        live = page.locator("#live-spark")
        assert live.count() == 1, "the session ended before the live view showed a sample"
        assert int(live.get_attribute("data-samples") or 0) > 0
        assert page.locator("#live-spark .line").get_attribute("points")
        assert "tps" in page.inner_text("[data-live=now]")
        page.screenshot(path=str(tmp_path / "live.png"), full_page=True)

        # The page reloads itself when the session ends (no #session between two
        # documents: hence ?.).
        page.wait_for_function(
            "() => ['succeeded', 'failed', 'cancelled'].includes("
            "document.getElementById('session')?.dataset.status)",
            timeout=120_000,
        )
        page.wait_for_load_state("load")
        sess = api.get(f"/api/v1/sessions/{sid}").json()
        assert sess["status"] == "succeeded", sess
        trials = api.get(f"/api/v1/sessions/{sid}/trials").json()
        assert len(trials) >= 2  # the baseline and at least one candidate

        # The chart: exactly one point per trial, a baseline line, the knob path labels.
        assert page.locator("#chart circle.trial").count() == len(trials)
        assert page.locator("#chart line.baseline").count() == 1
        assert "work_mem=" in page.inner_text("#chart")
        check_chart_structure(page, trials)
        assert page.locator("tr.trial-row").count() == len(trials)
        assert page.inner_text("[data-live=status]") == "succeeded"

        # Downloads: the same postgresql.conf and SQL script as the REST API.
        conf = download(page, "#download-conf")
        sql = download(page, "#download-sql")
        api_conf = api.get(f"/api/v1/sessions/{sid}/config", params={"format": "conf"}).text
        api_sql = api.get(f"/api/v1/sessions/{sid}/config", params={"format": "sql"}).text
        assert conf.startswith("# knobtune recommendation")
        assert f"# session: {sid}" in conf
        assert "work_mem" in conf
        assert sql.startswith("-- knobtune recommendation")
        assert f"-- session: {sid}" in sql
        assert without_timestamp(conf) == without_timestamp(api_conf)
        assert without_timestamp(sql) == without_timestamp(api_sql)

        # The result in words; the verdict on the candidate's row, not on the re-run.
        summary = page.inner_text("#summary")
        assert summary.startswith("Found a better configuration: work_mem")
        assert "confirmed by the final check" in summary
        assert f"knobtune apply {sid}" in summary
        kept = page.locator("tr.trial-row[data-verdict=keep]")
        assert kept.count() >= 1
        assert kept.first.get_attribute("data-role") == "candidate"

        shot = tmp_path / "dashboard.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"\ndashboard screenshot: {shot}")

        # Apply: the diff first, then the change, checked in pg_settings; then roll back.
        page.click("#apply-button")
        page.wait_for_url(f"**/sessions/{sid}/apply")
        assert "work_mem" in page.inner_text("#diff")
        assert "Nothing was changed" in page.inner_text("#apply-message")
        page.click("#apply-form button[type=submit]")
        page.wait_for_load_state("load")
        assert page.inner_text("#apply-message").startswith(f"Applied session {sid}")
        assert "in effect" in page.inner_text("#verified")
        page.goto(f"{server.url}/sessions/{sid}")
        assert "apply #" in page.inner_text("#apply")
        page.click("#rollback-button")
        page.wait_for_url(f"**/sessions/{sid}/rollback")
        page.click("#rollback-form button[type=submit]")
        page.wait_for_load_state("load")
        assert page.inner_text("#apply-message").startswith(f"Rolled back session {sid}")
        history = api.get(f"/api/v1/sessions/{sid}/applies").json()
        assert [h["status"] for h in history] == ["rolled-back"]

        # The index lists the session with its status and gain.
        page.goto(server.url + "/")
        row = page.locator(f"tr.session-row[data-session-id='{sid}']")
        assert row.locator(".badge").inner_text() == "succeeded"
        assert "sandbox-e2e" in row.inner_text()  # the target's name
        # one figure, in the objective's units, with how sure it is
        assert row.locator(".gain").inner_text() == sess["headline"]
        assert sess["headline"].startswith("throughput +")
        assert "confirmed by the final check" in row.inner_text()
        page.screenshot(path=str(tmp_path / "index.png"), full_page=True)
        print(f"index screenshot: {tmp_path / 'index.png'}")

        # A failed session: no empty chart, no download of a config that recommends nothing.
        # (The script passes a dry run of a few transactions, then fails in the baseline.)
        target_id = api.get("/api/v1/targets").json()[0]["id"]
        failing = "SELECT 1 / (CASE WHEN random() < 0.0005 THEN 0 ELSE 1 END);"
        r = api.post(
            "/api/v1/sessions",
            json={"target_id": target_id, "knobs": ["work_mem"], "max_trials": 11,
                  "workload": {"builtin": None, "scripts": [{"sql": failing}], "init": False,
                               "clients": 1, "jobs": 1, "duration_s": 3, "warmup_s": 1}},
        )  # fmt: skip
        assert r.status_code == 202, r.text
        bad = r.json()["id"]
        deadline = time.monotonic() + 120
        while api.get(f"/api/v1/sessions/{bad}").json()["status"] in ("queued", "running"):
            assert time.monotonic() < deadline, "the failing session did not end"
            time.sleep(0.5)
        assert api.get(f"/api/v1/sessions/{bad}").json()["status"] == "failed"
        page.goto(f"{server.url}/sessions/{bad}")
        assert page.locator("#chart").count() == 0
        assert page.locator("#download-conf").count() == 0
        assert "nothing to chart" in page.inner_text("#results")
        page.screenshot(path=str(tmp_path / "failed.png"), full_page=True)
        browser.close()

    # The deliberate 422 of the form-error check is the only failed load allowed.
    problems = [p for p in problems if not ("status of 422" in p and "/sessions'" in p)]
    assert problems == []


def fill_session_form(page: Page, *, duration_s: str, warmup_s: str) -> None:
    page.select_option("#session-form select[name=target_id]", label="sandbox-e2e")
    page.fill("#session-form input[name=knobs]", "work_mem")
    # work_mem decides its speed: the hint is kept within the walk, so the final check runs
    page.select_option("#session-form select[name=builtin]", "none")
    page.fill("#session-form textarea[name=script]", WORK_MEM_SQL)
    for name, value in {
        "scale": "1",
        "clients": "1",  # what is checked is the page, not a level: half the CPU of two
        "jobs": "1",
        "duration_s": duration_s,
        "warmup_s": warmup_s,
        "max_trials": "11",
    }.items():
        page.fill(f"#session-form input[name={name}]", value)


def check_chart_structure(page: Page, trials: list[dict[str, Any]]) -> None:
    """Issue 14's chart rules, measured in the browser's own layout."""
    # no line joins runs of different configs: the only path is the incumbent's step line
    assert page.locator("#chart path:not(.incumbent)").count() == 0
    assert page.locator("#chart path.incumbent").count() == 1
    final = [t for t in trials if t["role"].startswith("final-")]
    assert final, "the sort's work_mem hint was not kept: no final check to draw"
    assert page.locator("#chart g.final-check").count() == 1
    assert page.locator("#chart line.pair").count() == len(final) // 2
    geometry = page.evaluate(
        """() => {
        const box = (e) => { const r = e.getBoundingClientRect();
            return [r.left, r.top, r.right, r.bottom]; };
        const svg = document.querySelector('#chart svg');
        return {
            plot: box(svg.querySelector('.plot-area')),
            legend: box(svg.querySelector('.legend')),
            labels: [...svg.querySelectorAll('.knob-label')].map(box),
            points: [...svg.querySelectorAll('circle.trial')].map((c) => {
                const r = c.getBoundingClientRect();
                return [(r.left + r.right) / 2, (r.top + r.bottom) / 2]; }),
        }; }"""
    )
    left, top, right, bottom = geometry["plot"]
    for cx, cy in geometry["points"]:
        assert left <= cx <= right, (cx, geometry["plot"])
        assert top <= cy <= bottom, (cy, geometry["plot"])
    legend_top = geometry["legend"][1]
    for label in geometry["labels"]:
        assert label[3] <= legend_top, (label, geometry["legend"])  # no overlap


def download(page: Page, selector: str) -> str:
    with page.expect_download() as info:
        page.click(selector)
    path = info.value.path()
    assert path is not None
    return Path(path).read_text()


def without_timestamp(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if "generated:" not in line)


# -- without a browser: auth and the cost of a page -------------------------------------
def test_token_guards_pages_and_login_cookie_opens_the_api(tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'meta.db'}",
        work_dir=tmp_path,
        run_scheduler=False,
        api_token="s3cret-token",
    )
    with TestClient(create_app(settings), follow_redirects=False) as c:
        for path in ("/", "/sessions/1", "/partials/sessions"):
            r = c.get(path)
            assert r.status_code == 303, path
            assert r.headers["location"].startswith("/login?next=")
        assert c.get("/api/v1/sessions").status_code == 401
        # The static assets hold no data: served without a token.
        assert c.get("/static/dashboard.js").status_code == 200
        assert c.get("/", headers={"Authorization": "Bearer s3cret-token"}).status_code == 200
        # Logged out, the header says so and offers the login (not a "Log out" button).
        login = c.get("/login").text
        assert "not logged in" in login
        assert "Log out" not in login

        r = c.post("/login", data={"token": "wrong", "next": "/"})
        assert r.status_code == 401
        assert "wrong token" in r.text
        assert "knobtune_token" not in r.headers.get("set-cookie", "")
        # next must stay on this site (no open redirect).
        r = c.post("/login", data={"token": "s3cret-token", "next": "//evil.example/"})
        assert r.status_code == 303
        assert r.headers["location"] == "/"
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie
        assert "SameSite=lax" in cookie
        # The cookie now opens the pages and the API the page's script calls.
        index = c.get("/")
        assert index.status_code == 200
        assert "logged in" in index.text
        assert "not logged in" not in index.text
        assert "Log out" in index.text
        assert c.get("/api/v1/sessions").status_code == 200
        # Cross-site form posts are refused, even with the cookie.
        r = c.post("/targets", data={"name": "x"}, headers={"Origin": "http://evil.example"})
        assert r.status_code == 403
        c.post("/logout")
        assert c.get("/api/v1/sessions").status_code == 401


def test_pages_cost_a_fixed_number_of_queries(tmp_path: Path) -> None:
    """No N+1: the query count of a page does not grow with sessions or trials."""
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'meta.db'}", work_dir=tmp_path, run_scheduler=False
    )
    with TestClient(create_app(settings)) as c:
        db: Database = c.app.state.db  # type: ignore[attr-defined]

        def seed(n_sessions: int, n_trials: int) -> int:
            now = utcnow()
            with db.session() as s:
                t = Target(
                    name=f"t{n_sessions}-{n_trials}",
                    dsn="host=/nowhere password=hidden",
                    ram_bytes=1 << 30,
                    cpus=2,
                    probe={},
                    created_at=now,
                )
                s.add(t)
                s.flush()
                last = 0
                for _ in range(n_sessions):
                    sess = fake_session(t.id, now)
                    s.add(sess)
                    s.flush()
                    for j in range(1, n_trials + 1):
                        s.add(fake_trial(sess.id, j, now + timedelta(seconds=j)))
                    last = sess.id
                return last

        def queries(path: str) -> int:
            return count_queries(c, db, path)[0]

        small = seed(2, 2)
        q_index_small, q_session_small = queries("/"), queries(f"/sessions/{small}")
        big = seed(40, 30)
        q_index_big, q_session_big = queries("/"), queries(f"/sessions/{big}")
        assert q_index_big == q_index_small
        assert q_session_big == q_session_small
        assert q_index_big <= 8
        assert q_session_big <= 8
        # The secret never reaches the page.
        assert "hidden" not in c.get("/").text
        page = c.get(f"/sessions/{big}").text
        assert page.count('class="trial"') == 30
        assert 'class="trial-row' in page


def test_a_session_page_is_rendered_once_a_second_and_a_cancel_shows_at_once(
    tmp_path: Path,
) -> None:
    """Fifty viewers of a running session cost one render a second (bench/api_load.py)."""
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'meta.db'}", work_dir=tmp_path, run_scheduler=False
    )
    with TestClient(create_app(settings)) as c:
        db: Database = c.app.state.db  # type: ignore[attr-defined]
        now = utcnow()
        with db.session() as s:
            t = Target(name="t", dsn="host=/nowhere", probe={}, created_at=now)
            s.add(t)
            s.flush()
            sess = fake_session(t.id, now)
            sess.status, sess.phase, sess.finished_at = "running", "trial 1", None
            s.add(sess)
            s.flush()
            s.add(fake_trial(sess.id, 1, now))
            sid = sess.id
        path = f"/sessions/{sid}"

        first, page = count_queries(c, db, path)
        assert first > 0
        assert "cancelling" not in page
        assert count_queries(c, db, path)[0] == 0  # the same second: no query at all

        r = c.post(f"{path}/cancel", follow_redirects=False)
        assert r.status_code == 303
        after_cancel, page = count_queries(c, db, path)
        assert after_cancel > 0  # not the stale page
        assert "cancelling" in page

        with db.session() as s:
            s.add(fake_trial(sid, 2, now))
        time.sleep(1.1)  # PAGE_TTL_S
        later, page = count_queries(c, db, path)
        assert later > 0
        assert page.count('class="trial"') == 2


def count_queries(c: TestClient, db: Database, path: str) -> tuple[int, str]:
    """SQL statements one GET of ``path`` issued, and the page it returned."""
    count = 0

    def on_execute(*_args: Any) -> None:
        nonlocal count
        count += 1

    event.listen(db.engine, "before_cursor_execute", on_execute)
    try:
        r = c.get(path)
        assert r.status_code == 200, r.text
    finally:
        event.remove(db.engine, "before_cursor_execute", on_execute)
    return count, r.text


def fake_session(target_id: int, now: Any) -> TuningSession:
    return TuningSession(
        target_id=target_id,
        status="succeeded",
        phase="done",
        request={"knobs": ["work_mem"], "workload": {"builtin": "tpcb-like", "duration_s": 2}},
        seed=1,
        start_config={"work_mem": "4MB"},
        best_config={"work_mem": "16MB"},
        baseline_tps=1000.0,
        best_tps=1100.0,
        gain=0.1,
        trials_planned=30,
        benchmark_s=10.0,
        notes=[],
        cancel_requested=False,
        attempts=1,
        created_at=now,
        started_at=now,
        finished_at=now + timedelta(minutes=3),
    )


def fake_trial(session_id: int, index: int, at: Any) -> Trial:
    return Trial(
        session_id=session_id,
        index=index,
        role="baseline" if index == 1 else "candidate",
        knob=None if index == 1 else "work_mem",
        value=None if index == 1 else f"{4 + index}MB",
        config={"work_mem": f"{4 + index}MB"},
        samples=[1000.0 + index, 990.0, 1010.0],
        median_tps=1000.0 + index,
        verdict=None if index == 1 else ("keep" if index % 3 == 0 else "revert"),
        gain=None if index == 1 else 0.01 * index,
        started_at=at,
        finished_at=at + timedelta(seconds=1),
    )
