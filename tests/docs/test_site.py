"""The manual builds in strict mode; README is a front page that stays in the repository;
the test command README shows is the one CI runs; docs/cli.md is the CLI's own help."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import is_slow
from tests.docs.blocks import command, replace
from tests.docs.cli_reference import current, reference
from tests.helpers import ROOT

BIN = Path(sys.executable).parent


def test_manual_builds_in_strict_mode(tmp_path: Path) -> None:
    block = command("docs-build")
    script = replace(block, "--site-dir site", f"--site-dir {tmp_path / 'site'}")
    script = replace(script, ".venv/bin/", f"{BIN}/")
    res = subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    site = tmp_path / "site"
    for page in ("index.html", "tuning/index.html", "results/tpch-h1/index.html"):
        assert (site / page).is_file(), page
    # the screenshots of the four outcomes made it into the site
    for outcome in ("confirmed", "no-change", "unconfirmed", "failed"):
        assert (site / "img" / f"session-{outcome}.png").stat().st_size > 10_000


def test_readme_is_a_front_page_that_stays_in_the_repository() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 176  # 170, and the fast lane's command since issue 41
    for heading in ("## Try it", "## Tune your own server in five steps", "## How to read"):
        assert heading in text
    assert "://" not in text, "README points outside the repository"
    for target in re.findall(r"\]\(([^)#]+)", text):
        assert (ROOT / target).exists(), target


def test_ci_runs_the_test_command_readme_shows() -> None:
    readme = command("tests").strip().splitlines()
    assert readme == ["bash .ci/bootstrap-tests && .venv/bin/python -m pytest"]
    setup, run = readme[0].split(" && ")
    started = [ln.strip() for ln in command("run-tests").strip().splitlines()]
    assert started == [setup, run]  # the manual says the same, in two lines
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    ci = [ln for ln in ci if ln and not ln.startswith("#")]
    assert ci[-1] == run, ".ci/run must end with README's test command"
    assert "bash .ci/bootstrap-tests" in ci
    # pytest's exit 5 (it collected no test) fails CI like any failure: errexit is on and
    # nothing masks the command's status
    assert "set -euo pipefail" in ci, ".ci/run must stop on any failing command"
    assert not [ln for ln in ci if "set +e" in ln or "|| true" in ln or "|| :" in ln]


FAST_LANE = '.venv/bin/python -m pytest -m "not slow"'


def _whole_suite_collected(config: pytest.Config) -> bool:
    """Did this run collect every test of the suite, none deselected (README's command)?"""
    o = config.option
    return (
        config.args_source is pytest.Config.ArgsSource.TESTPATHS
        and not (o.keyword or o.markexpr or o.deselect or o.ignore or o.ignore_glob)
        and not (getattr(o, "lf", False) or getattr(o, "failedfirst", False))
    )


def test_the_fast_lane_collects_no_slow_test(request: pytest.FixtureRequest) -> None:
    """README's and docs/contributing.md's fast lane, the same command: it leaves out every
    test that starts a server or a process (tests/conftest.py classifies them) and keeps
    the rest. Read from this run's own collection when it is README's whole suite and the
    command is the plain one (the same classification, tests/conftest.py's is_slow; a
    second collection of the suite takes 17 s of CPU, 83 s of a worker on a loaded run);
    else the command runs, collecting."""
    block = command("tests-fast")
    assert command("fast-lane").strip() == block.strip()
    if block.strip() == FAST_LANE and _whole_suite_collected(request.config):
        # a run without -m leaves its items unmarked (tests/conftest.py): classified here,
        # on one worker
        items = request.session.items
        fast = {i.nodeid for i in items if not is_slow(i)}
        selected, deselected = len(fast), len(items) - len(fast)
    else:
        script = replace(block, '-m "not slow"', '-m "not slow" --collect-only -q -n 0')
        res = subprocess.run(
            ["bash", "-e", "-c", replace(script, ".venv/bin/", f"{BIN}/")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        counts = re.search(r"(\d+)/(\d+) tests collected \((\d+) deselected\)", res.stdout)
        assert counts, res.stdout[-2000:]
        selected, deselected = int(counts[1]), int(counts[3])
        fast = set(res.stdout.splitlines())
    assert selected > 300, (selected, deselected)
    assert deselected > 200, (selected, deselected)
    # a sandbox fixture's user, and a test that starts a process (this one): not fast;
    # a pure test of the same module as the first: fast
    assert "tests/app/postgres/test_target.py::test_probe" not in fast
    assert "tests/docs/test_site.py::test_the_fast_lane_collects_no_slow_test" not in fast
    assert "tests/app/postgres/test_target.py::test_auto_conf_round_trip" in fast


def test_cli_reference_is_the_clis_own_help() -> None:
    fix = "run .venv/bin/python -m tests.docs.cli_reference"
    assert current().strip() == reference().strip(), f"docs/cli.md differs from --help: {fix}"


def test_compose_command_names_a_valid_compose_file(tmp_path: Path) -> None:
    """No Docker engine here: the shown command is checked up to `up` (config -q)."""
    block = command("compose-up")
    script = replace(block, "docker-compose up -d --build", "docker-compose config -q")
    compose = shutil.which("docker-compose")
    assert compose, "install docker-compose (bash .ci/bootstrap-tests)"
    res = subprocess.run(
        ["bash", "-e", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert "openssl rand -hex 24" in block  # a fresh token, never a fixed one


def test_results_pages_give_a_date_and_the_command() -> None:
    for page in sorted((ROOT / "docs" / "results").glob("*.md")):
        if page.name == "index.md":
            continue
        text = page.read_text()
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", text), f"{page.name}: no date"
        assert "<!-- command: results-" in text, f"{page.name}: no command to reproduce it"
