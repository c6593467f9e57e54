"""The product as a user runs it: the installed ``knobtune`` command, a fresh directory as
its cwd, and no KNOBTUNE_* variable unless a test says so (the defaults are under test)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from app.postgres.sandbox import Sandbox, free_port

# The virtualenv's bin directory (README's `.venv/bin/`), wherever the test runs from.
BIN = Path(sys.executable).parent


def user_env(**extra: str) -> dict[str, str]:
    """The caller's environment without any KNOBTUNE_* setting, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KNOBTUNE_")}
    return {**env, **extra}


def destroy_sandboxes_under(root: Path) -> None:
    """Stop and remove managed sandboxes a failed test may have left under ``root``."""
    sandboxes = root / ".knobtune" / "sandboxes"
    for path in sorted(sandboxes.iterdir()) if sandboxes.is_dir() else []:
        with contextlib.suppress(Exception):
            Sandbox.open(path).destroy()


@pytest.fixture
def user_dir() -> Iterator[Path]:
    """A fresh, empty directory under /tmp that the postgres OS user can enter.

    (pytest's tmp_path is private to root, and a sandbox under it could not start.)
    """
    path = Path(tempfile.mkdtemp(prefix="knobtune-user-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        destroy_sandboxes_under(path)
        shutil.rmtree(path, ignore_errors=True)


class UserService:
    """`knobtune serve` started in ``cwd`` with the default settings (no KNOBTUNE_*)."""

    def __init__(self, cwd: Path, **env: str) -> None:
        self.cwd = cwd
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = user_env(**env)
        self.log_path = cwd / "service.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self, timeout_s: float = 60) -> None:
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [str(BIN / "knobtune"), "serve", "--port", str(self.port), "--log-level", "warning"],
            cwd=self.cwd,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the service exited: {self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the service did not start: {self.log_tail()}")

    def log_tail(self, n: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return ""

    def stop(self) -> None:
        """SIGTERM, as a user's Ctrl-C or systemd stop does."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def kill(self) -> None:
        """SIGKILL: no clean-up of any kind, as in a crash."""
        assert self.proc is not None
        self.proc.kill()  # the service process only (the OOM killer's way)
        self.proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None


def wait_session(
    api: httpx.Client, sid: int, statuses: set[str], timeout: float = 400
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        body = api.get(f"/api/v1/sessions/{sid}").json()
        if body["status"] in statuses:
            return body
        time.sleep(1)
    raise AssertionError(f"session {sid} did not reach {statuses}: {body}")
