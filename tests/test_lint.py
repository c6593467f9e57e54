"""ruff and mypy --strict are part of the test suite, so README's one test command is all of CI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff_is_clean() -> None:
    res = run("ruff", "check", "app", "optimizer", "migrations", "tests", "bench")
    assert res.returncode == 0, res.stdout + res.stderr


def test_mypy_strict_is_clean() -> None:
    res = run("mypy")
    assert res.returncode == 0, res.stdout + res.stderr
