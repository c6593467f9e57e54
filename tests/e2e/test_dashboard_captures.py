"""The captures pages in headless Chromium: capture a sandbox's workload from the targets'
form, read its summary and top queries, start a session from it, delete it (issue 28)."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from playwright.sync_api import ConsoleMessage, sync_playwright

from app.postgres.sandbox import Sandbox
from app.settings import Settings
from tests.e2e.test_dashboard import CHROMIUM, CHROMIUM_ARGS, Server
from tests.helpers import logging_sandbox


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    work = Path(tempfile.mkdtemp(prefix="knobtune-dash-cap-"))
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'meta.db'}", work_dir=work, poll_seconds=0.3
    )
    try:
        with Server(settings) as srv:
            yield srv
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.timeout(180)
def test_capture_summary_replay_form_and_delete_in_chromium(server: Server) -> None:
    assert shutil.which(CHROMIUM), "install Debian's chromium: apt-get install chromium"
    sb: Sandbox = logging_sandbox(pgss=True)
    problems: list[str] = []

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            problems.append(f"console: {msg.text}")

    try:
        api = httpx.Client(base_url=server.url, timeout=30)
        t = api.post("/api/v1/targets", json={"name": "dash-cap", "dsn": sb.dsn})
        assert t.status_code == 201, t.text
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page()
            page.on("console", on_console)
            page.on("pageerror", lambda err: problems.append(f"page error: {err}"))
            page.set_default_timeout(30_000)

            # the capture form under Targets
            page.goto(server.url + "/")
            page.select_option("#capture-form select[name=target_id]", label="dash-cap")
            page.fill("#capture-form input[name=seconds]", "10")
            page.fill("#capture-form input[name=database]", "knobtune")
            page.click("#capture-form button[type=submit]")
            page.wait_for_url("**/captures/*")
            cid = int(page.url.rstrip("/").rsplit("/", 1)[1])
            assert page.locator("#capture button", has_text="Cancel the capture").count() == 1
            deadline = time.monotonic() + 30
            while not api.get(f"/api/v1/captures/{cid}").json()["phase"].startswith("logging"):
                assert time.monotonic() < deadline, "the capture never started logging"
                time.sleep(0.2)
            with psycopg.connect(sb.bench_dsn, autocommit=True) as conn:
                conn.execute("CREATE TABLE acc (id int PRIMARY KEY, note text)")
                for i in range(20):
                    conn.execute("INSERT INTO acc VALUES (%s, %s)", [i, f"note {i}"])
                    conn.execute("SELECT note FROM acc WHERE id = %s", [i])
            # the page refreshes itself until the capture ends (between two documents there
            # is no #capture: ?. or the wait fails on a TypeError, as in a CI run)
            page.wait_for_function(
                "() => ['succeeded', 'failed', 'cancelled'].includes("
                "document.getElementById('capture')?.dataset.status)",
                timeout=60_000,
            )
            assert page.get_attribute("#capture", "data-status") == "succeeded"
            summary = page.inner_text("#summary")
            assert "41 statements" in summary  # the CREATE, 20 inserts, 20 selects
            rows = page.locator("#top-queries tr.top-query")
            assert rows.count() == 3
            assert "INSERT INTO acc VALUES ($1, $2)" in page.inner_text("#top-queries")
            assert "note 1" not in page.content()  # values never shown
            assert "logging settings restored" in page.inner_text("#capture")

            # the list
            page.click("header nav a:has-text('Captures')")
            page.wait_for_url("**/captures")
            row = page.locator(f"#captures-table tr.capture-row[data-capture-id='{cid}']")
            assert row.count() == 1
            assert "dash-cap" in row.inner_text()
            row.locator("a").first.click()
            page.wait_for_url(f"**/captures/{cid}")

            # a session from this capture: the replay workload
            page.select_option("#replay-form select[name=target_id]", label="dash-cap")
            page.fill("#replay-form input[name=speed]", "2")
            page.fill("#replay-form input[name=max_trials]", "11")
            page.fill("#replay-form input[name=duration_s]", "3")
            page.fill("#replay-form input[name=warmup_s]", "0")
            page.click("#replay-form button[type=submit]")
            page.wait_for_load_state("load")
            # the session starts on the capture's replay
            if "/sessions/" not in page.url:
                error = page.locator(".error")
                raise AssertionError(error.inner_text() if error.count() else page.url)
            page.wait_for_url("**/sessions/*")
            sid = int(page.url.rstrip("/").rsplit("/", 1)[1])
            api.post(f"/api/v1/sessions/{sid}/cancel")
            page.goto(f"{server.url}/captures/{cid}")

            # delete
            page.click("#delete-capture button")
            page.wait_for_url("**/captures")
            assert page.locator(f"tr.capture-row[data-capture-id='{cid}']").count() == 0
            assert "No captures yet" in page.inner_text("#captures")
            browser.close()
        assert api.get(f"/api/v1/captures/{cid}").status_code == 404
        assert not problems, problems
    finally:
        sb.destroy()
