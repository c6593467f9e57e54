"""README's two first commands: the demo's setup installs only what the demo needs."""

from __future__ import annotations

import re
import subprocess

from tests.docs.blocks import command
from tests.helpers import ROOT

DEMO = "bash .ci/bootstrap && .venv/bin/knobtune demo --out demo"
TESTS = "bash .ci/bootstrap-tests && .venv/bin/python -m pytest"


def _commands(script: str) -> str:
    """The script without its comments: what it runs."""
    return "\n".join(ln.split("#", 1)[0] for ln in script.splitlines())


def test_readme_first_commands_are_the_two_scripts() -> None:
    readme = (ROOT / "README.md").read_text()
    assert readme.index("<!-- command: demo -->") < readme.index("<!-- command: tests -->")
    assert readme.index("<!-- command: tests -->") < readme.index("## Tune your own server")
    assert command("demo").strip() == DEMO
    assert command("tests").strip() == TESTS
    ci = _commands((ROOT / ".ci" / "run").read_text())
    assert "bash .ci/bootstrap-tests" in ci
    assert ".venv/bin/python -m pytest" in ci


def test_demo_setup_installs_no_test_tools() -> None:
    demo = _commands((ROOT / ".ci" / "bootstrap").read_text())
    for tool in ("chromium", "docker", "playwright", "[dev", "schemathesis"):
        assert tool not in demo, f".ci/bootstrap installs {tool}: that belongs to the tests"
    installs = re.findall(r"^\s*apt-get install (.*)$", demo, flags=re.M)
    assert installs, "the demo needs PostgreSQL when it is missing"
    for line in installs:
        packages = {w for w in line.split() if not w.startswith("-")}
        assert packages <= {"postgresql", "postgresql-contrib"}, line
    # Root is asked for only inside the branch that installs PostgreSQL.
    assert demo.index("id -u") > demo.index("if ! have_server || ! have_pgbench")


def test_test_setup_adds_the_test_tools_on_top() -> None:
    tests = _commands((ROOT / ".ci" / "bootstrap-tests").read_text())
    assert "bash .ci/bootstrap" in tests
    for tool in ("chromium", "docker-compose", ".[dev,bench]"):
        assert tool in tests


def test_scripts_are_valid_bash() -> None:
    for name in ("bootstrap", "bootstrap-tests", "run"):
        res = subprocess.run(["bash", "-n", str(ROOT / ".ci" / name)], capture_output=True)
        assert res.returncode == 0, res.stderr
