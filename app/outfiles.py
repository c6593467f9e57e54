"""Files the CLI writes for a user (a session's config, chart and record; a sweep's chart;
a capture's log): only where asked, never into PostgreSQL's own directories, never over a
file without ``--force``, and never half-written.

- A directory inside a data directory (it or a parent holds ``PG_VERSION`` or
  ``postmaster.pid``) is refused, ``--force`` or not: nothing of knobtune's belongs there
  (base backups copy it, and a file named like a config is one typo from a live one).
- A directory with a ``postgresql.conf`` in it or in its parent (``/etc/postgresql/15/main``
  and its ``conf.d``, which PostgreSQL reads every ``*.conf`` of) is refused unless
  ``--force``: a ``.conf`` dropped there may be loaded at the next reload.
- A file is written to a temporary file in its directory, then linked to its name (which
  fails if anything is there, a dangling symlink included) or, with ``--force``, renamed
  over it: a reader never sees half a file, and a symlink at the name is replaced, never
  followed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path

DATA_DIR_MARKERS = ("PG_VERSION", "postmaster.pid")
CONFIG_FILE = "postgresql.conf"


class OutputRefused(Exception):
    """Why a file was not written, in words that say what to change."""


def _holder(
    start: Path, names: tuple[str, ...], levels: int | None = None
) -> tuple[Path, str] | None:
    """The nearest of ``start`` and its parents (``levels`` of them; None: all) that holds
    one of ``names``, with the name."""
    for d in (start, *start.parents)[: None if levels is None else levels + 1]:
        for name in names:
            if os.path.lexists(d / name):
                return d, name
    return None


def check_dir(out: Path, *, force: bool = False) -> Path:
    """``out`` resolved, after checking that knobtune may write into it (it may not exist
    yet); raises OutputRefused."""
    where = out.expanduser().resolve()
    if where.exists() and not where.is_dir():
        raise OutputRefused(f"{out} is not a directory; give --out a directory")
    data = _holder(where, DATA_DIR_MARKERS)
    if data is not None:
        raise OutputRefused(
            f"{out} is inside a PostgreSQL data directory ({data[0]} holds {data[1]}); "
            "give --out a directory of your own"
        )
    conf = _holder(where, (CONFIG_FILE,), levels=1)
    if conf is not None and not force:
        raise OutputRefused(
            f"{out} is a PostgreSQL configuration directory ({conf[0]} holds {CONFIG_FILE}; "
            "PostgreSQL may load a .conf file written there); give --out a directory of "
            "your own, or --force to write there anyway"
        )
    return where


def check_free(paths: list[Path], *, force: bool = False) -> None:
    """Refuse (OutputRefused) when one of ``paths`` exists and ``force`` is not given."""
    if force:
        return
    taken = [p for p in paths if os.path.lexists(p)]
    if taken:
        raise OutputRefused(
            f"{taken[0]} exists; knobtune never replaces a file unless asked: give --force "
            "to replace it, or another --out"
        )


def write_file(path: Path, data: bytes, *, mode: int = 0o644, force: bool = False) -> None:
    """Write ``data`` to ``path`` atomically with ``mode``; refuse an existing ``path``
    (OutputRefused) unless ``force``. The directory must exist."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)  # mkstemp makes 0600, and fchmod ignores the umask
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if force:
            os.replace(tmp, path)  # a symlink at path is replaced, not followed
        else:
            _link_new(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    with contextlib.suppress(OSError):  # the new name survives a crash (best effort)
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _link_new(tmp: str, path: Path) -> None:
    """Give ``tmp``'s file the name ``path`` only if nothing has that name."""
    try:
        os.link(tmp, path)  # atomic, and fails on any existing entry
    except FileExistsError:
        raise OutputRefused(
            f"{path} exists; knobtune never replaces a file unless asked: give --force to "
            "replace it, or another --out"
        ) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV):
            raise
        # a filesystem without hard links: check, then rename (a narrow race, no follow)
        check_free([path])
        os.replace(tmp, path)
