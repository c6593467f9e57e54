"""Running the docs' shell blocks as a user would: bash -e in a fresh directory, the
virtualenv activated (its bin directory first on PATH), the user's own environment."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.acceptance.conftest import BIN, user_env


def bash(
    script: str, cwd: Path, timeout: float = 900, **env: str
) -> subprocess.CompletedProcess[str]:
    environ = user_env(PATH=f"{BIN}:{os.environ['PATH']}", VIRTUAL_ENV=str(BIN.parent), **env)
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def knobtune(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return bash(" ".join(f"'{a}'" for a in ("knobtune", *args)), cwd, timeout)
