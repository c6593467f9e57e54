"""Where PostgreSQL's server binaries are, and which version they are.

Apart from the sandbox manager so that everything that runs a binary (restart methods,
sandboxes, pgbench) can find it without importing the sandbox manager.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from pathlib import Path

INSTALL_HINT = "apt-get install postgresql postgresql-contrib"
BINDIR_ENV = "KNOBTUNE_PG_BINDIR"
_SERVER_BINARIES = ("initdb", "pg_ctl", "postgres")


class PostgresNotInstalled(RuntimeError):
    """PostgreSQL server binaries are missing; the message says what to install."""


def find_bindir() -> Path:
    """Directory holding initdb, pg_ctl and postgres.

    Order: $KNOBTUNE_PG_BINDIR (must be valid when set), ``pg_config --bindir``,
    the newest /usr/lib/postgresql/<ver>/bin, then initdb on PATH.
    """
    explicit = os.environ.get(BINDIR_ENV)
    if explicit:
        path = Path(explicit)
        if _has_server_binaries(path):
            return path
        raise PostgresNotInstalled(
            f"{BINDIR_ENV}={explicit} does not contain {', '.join(_SERVER_BINARIES)}; "
            f"point it at PostgreSQL's bin directory or install the server: {INSTALL_HINT}"
        )
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
            if out:
                candidates.append(Path(out))
    candidates.extend(_debian_bindirs())
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).resolve().parent)
    for path in candidates:
        if _has_server_binaries(path):
            return path
    raise PostgresNotInstalled(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) were not found "
        "(looked at pg_config --bindir, /usr/lib/postgresql/<version>/bin and PATH). "
        f"Install them with: {INSTALL_HINT} (or set {BINDIR_ENV} to their directory)"
    )


def _has_server_binaries(path: Path) -> bool:
    return all(os.access(path / name, os.X_OK) for name in _SERVER_BINARIES)


def _debian_bindirs() -> list[Path]:
    base = Path("/usr/lib/postgresql")
    found: list[tuple[float, Path]] = []
    if base.is_dir():
        for d in base.iterdir():
            with contextlib.suppress(ValueError):
                found.append((float(d.name), d / "bin"))
    return [p for _, p in sorted(found, reverse=True)]


def server_version(bindir: Path) -> int:
    """Major version of the binaries in ``bindir`` (e.g. 15), from ``postgres --version``."""
    out = subprocess.run(
        [str(bindir / "postgres"), "--version"], capture_output=True, text=True, timeout=10
    ).stdout
    m = re.search(r"(\d+)(?:\.\d+)?", out)
    if not m:
        raise PostgresNotInstalled(f"cannot read the version of {bindir / 'postgres'}: {out!r}")
    return int(m.group(1))
