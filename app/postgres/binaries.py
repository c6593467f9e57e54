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
# Other versions' builds, one <dir>/<major>/bin each: .ci/bootstrap-tests unpacks
# PostgreSQL 18 there (the postgres OS user must be able to run them, so not under a
# private home). KNOBTUNE_PG_CACHE replaces the list.
CACHE_ENV = "KNOBTUNE_PG_CACHE"
CACHE_DIRS = (Path("/opt/knobtune/postgresql"), Path.home() / ".cache/knobtune/postgresql")


class PostgresNotInstalled(RuntimeError):
    """PostgreSQL server binaries are missing; the message says what to install."""


def find_bindir(version: int | None = None) -> Path:
    """Directory holding initdb, pg_ctl and postgres.

    Order: $KNOBTUNE_PG_BINDIR (must be valid when set), ``pg_config --bindir``,
    the newest /usr/lib/postgresql/<ver>/bin, initdb on PATH, then the cached builds
    (CACHE_DIRS). With ``version`` (a major version), the first of those that is it,
    $KNOBTUNE_PG_BINDIR included when it is that version.
    """
    if version is not None:
        return _bindir_of(version)
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
    candidates.extend(_cached_bindirs())
    for path in candidates:
        if _has_server_binaries(path):
            return path
    raise PostgresNotInstalled(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) were not found "
        "(looked at pg_config --bindir, /usr/lib/postgresql/<version>/bin and PATH). "
        f"Install them with: {INSTALL_HINT} (or set {BINDIR_ENV} to their directory)"
    )


def installed() -> dict[int, Path]:
    """Every PostgreSQL major version found on this host and its bin directory (the first
    found per version, in find_bindir's order)."""
    candidates: list[Path] = []
    explicit = os.environ.get(BINDIR_ENV)
    if explicit:
        candidates.append(Path(explicit))
    with contextlib.suppress(PostgresNotInstalled):
        candidates.append(find_bindir())
    candidates.extend(_debian_bindirs())
    candidates.extend(_cached_bindirs())
    found: dict[int, Path] = {}
    for path in candidates:
        if path in found.values() or not _has_server_binaries(path):
            continue
        with contextlib.suppress(PostgresNotInstalled, OSError, subprocess.SubprocessError):
            found.setdefault(server_version(path), path)
    return found


def _bindir_of(version: int) -> Path:
    found = installed()
    if version in found:
        return found[version]
    have = ", ".join(f"{v} ({p})" for v, p in sorted(found.items())) or "none"
    raise PostgresNotInstalled(
        f"PostgreSQL {version} is not installed here (found: {have}); install it (e.g. "
        f"postgresql-{version} from the PostgreSQL apt repository) and set {BINDIR_ENV} to "
        f"its bin directory, or unpack a build into {CACHE_DIRS[0]}/{version}"
    )


def _cached_bindirs() -> list[Path]:
    """<dir>/<major>/bin of the cache directories, newest version first."""
    env = os.environ.get(CACHE_ENV)
    roots = [Path(p) for p in env.split(os.pathsep) if p] if env else list(CACHE_DIRS)
    found: list[tuple[int, Path]] = []
    for root in roots:
        with contextlib.suppress(OSError):
            for d in root.iterdir():
                if d.name.isdigit():
                    found.append((int(d.name), d / "bin"))
    return [p for _, p in sorted(found, key=lambda t: -t[0])]


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
