"""Removing a target from the dashboard, in headless Chromium: its history stays."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import sync_playwright

from app.settings import Settings
from tests.e2e.test_dashboard import CHROMIUM, CHROMIUM_ARGS, Server


@pytest.fixture
def idle_server(tmp_path: Path) -> Iterator[Server]:
    """The service without a scheduler: a session stays queued until cancelled."""
    work = Path(tempfile.mkdtemp(prefix="knobtune-dash-rm-"))
    work.chmod(0o755)  # sandboxes run as the postgres OS user
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'meta.db'}", work_dir=work, run_scheduler=False
    )
    try:
        with Server(settings) as srv:
            yield srv
            for t in httpx.get(f"{srv.url}/api/v1/targets", timeout=10).json():
                httpx.delete(f"{srv.url}/api/v1/targets/{t['id']}?history=drop", timeout=60)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.timeout(180)
def test_remove_target_keeping_history_from_the_dashboard(idle_server: Server) -> None:
    assert shutil.which(CHROMIUM), "install Debian's chromium: apt-get install chromium"
    api = httpx.Client(base_url=idle_server.url, timeout=60)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.set_default_timeout(30_000)
        page.goto(idle_server.url + "/")
        page.fill("#target-form input[name=name]", "to-remove")
        page.check("#target-form input[name=sandbox]")
        page.click("#target-form button[type=submit]")
        page.wait_for_url("**/?target_id=*")
        target = api.get("/api/v1/targets").json()[0]
        sandbox_root = Path(target["data_dir"]).parent
        sid = api.post(
            "/api/v1/sessions",
            json={"target_id": target["id"], "knobs": ["work_mem"], "max_trials": 12},
        ).json()["id"]
        assert api.post(f"/api/v1/sessions/{sid}/cancel").json()["status"] == "cancelled"

        page.goto(idle_server.url + "/")
        row = page.locator("#targets tr.target-row", has_text="to-remove")
        assert row.locator("button[value=keep]").count() == 1
        assert row.locator("button[value=drop]").count() == 1
        row.locator("button[value=keep]").click()
        page.wait_for_url("**/#targets")
        assert "to-remove" not in page.inner_text("#targets")
        assert page.locator(f"tr.session-row[data-session-id='{sid}']").count() == 1
        browser.close()
    assert api.get(f"/api/v1/sessions/{sid}").json()["status"] == "cancelled"
    assert api.get("/api/v1/targets").json() == []
    assert not sandbox_root.exists()  # the sandbox went with the target
