"""Where this service's managed sandboxes live: a directory the postgres OS user can enter.

A sandbox cluster runs as the postgres OS user when the service runs as root, so every
directory above it must let that user through. A service started in /root or in a 0700
temporary directory has a work dir nobody else can enter: its sandboxes then go to a
directory of their own under the system's temp dir (the same one for the same work dir,
so that a restarted service finds them). ``KNOBTUNE_SANDBOX_DIR`` sets the place; one the
postgres user cannot enter is refused with a message that names that setting.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from app.errors import ServiceError
from app.postgres.sandbox import PostgresNotInstalled, as_postgres
from app.settings import Settings

SETTING = "KNOBTUNE_SANDBOX_DIR"


def postgres_can_enter(path: Path) -> bool:
    """Whether the OS user that runs sandboxes can enter ``path`` (always, when not root)."""
    if os.geteuid() != 0:
        return True
    try:
        argv = as_postgres(["test", "-x", str(path)])
    except PostgresNotInstalled:
        return True  # Sandbox.create says what is missing, more usefully
    return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0


def sandbox_parent(settings: Settings, *, create: bool = True) -> Path:
    """The directory new sandboxes go under; raises ServiceError(422) naming the setting."""
    if settings.sandbox_dir is not None:
        parent = settings.sandbox_dir
        if create:
            parent.mkdir(parents=True, exist_ok=True)
            if not postgres_can_enter(parent):
                raise ServiceError(
                    422,
                    f"the postgres OS user cannot enter {SETTING}={parent} (it or a directory "
                    f"above it is private): set {SETTING} to a directory it can enter, e.g. "
                    "/var/tmp/knobtune-sandboxes, and start the service again",  # noqa: S108
                )
        return parent
    preferred = settings.work_dir / "sandboxes"
    if not create:
        return preferred if preferred.is_dir() else _fallback(settings)
    preferred.mkdir(parents=True, exist_ok=True)
    if postgres_can_enter(preferred):
        return preferred
    fallback = _fallback(settings)
    fallback.mkdir(mode=0o711, exist_ok=True)
    fallback.chmod(0o711)  # enter-only for others: the sandboxes inside are 0700 each
    return fallback


def _fallback(settings: Settings) -> Path:
    tag = hashlib.sha256(str(settings.work_dir).encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"knobtune-sandboxes-{tag}"


def drop_empty_fallback(settings: Settings) -> None:
    """At shutdown: remove the temp-dir fallback (above) if no sandbox is left in it, so that
    a service leaves no empty directory in the shared temp dir (the next start makes it
    again where needed). rmdir fails on a directory that holds anything: nothing is lost."""
    with contextlib.suppress(OSError):
        _fallback(settings).rmdir()


def owned_by_this_service(settings: Settings, sandbox_dir: Path) -> bool:
    """Whether a sandbox lives where this service puts them (stopped at its shutdown)."""
    places = [settings.work_dir, _fallback(settings)]
    if settings.sandbox_dir is not None:
        places.append(settings.sandbox_dir)
    return any(sandbox_dir.is_relative_to(p) for p in places)
