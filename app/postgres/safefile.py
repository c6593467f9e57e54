"""File work in directories another OS user owns (a data directory, a sandbox's files).

A root service that reads or writes ``<data_dir>/pg_hba.conf`` by its path follows
whatever the directory's owner (``postgres``) planted there: a symbolic link to
/etc/shadow is read into an error message, one to /etc/passwd is overwritten and
chowned. Here every file is opened relative to a descriptor of its directory with
``O_NOFOLLOW`` (and ``O_NONBLOCK``: a FIFO never blocks the service), and must be a
regular file with one link owned by the directory's owner or by us: what we touch is
what that owner could touch itself. A directory is opened with ``O_NOFOLLOW`` as well
(its last component; the components above belong to the operator) and must be owned by
the expected user or by us. Writes of new contents go to a fresh file that replaces
the old one by ``rename`` within the directory, so a link swapped in meanwhile is
replaced, never followed. A refusal is :class:`UnsafeFile`, an ``OSError`` whose
message names the path and what was wrong with it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UnsafeFile(OSError):
    """A path was not followed or used: a symbolic link, another kind of file, another
    owner, a second hard link. The message says which and what to do."""


def _refuse(path: Path, why: str) -> UnsafeFile:
    return UnsafeFile(
        errno.EPERM,
        f"{path} {why}: knobtune (running as uid {os.geteuid()}) does not follow or "
        "use it there; remove it (the data directory's owner or someone with its access "
        "put it there) and try again",
    )


def _owners(owner: int | None) -> set[int]:
    return {os.geteuid()} if owner is None else {owner, os.geteuid()}


@contextlib.contextmanager
def open_dir(path: Path, owner: int | None = None) -> Iterator[int]:
    """A descriptor of directory ``path`` (not a symbolic link; owned by ``owner`` or us)."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path):
            raise _refuse(path, "is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if st.st_uid not in _owners(owner):
            raise _refuse(path, f"belongs to uid {st.st_uid}, not the expected owner")
        yield fd
    finally:
        os.close(fd)


def _open_in(dir_fd: int, name: str, flags: int, path: Path, owner: int | None) -> int:
    try:
        fd = os.open(name, flags | _FILE_FLAGS, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(path, "is a symbolic link") from None
        raise
    st = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = "is not a regular file"
    elif st.st_nlink != 1:
        problem = f"has {st.st_nlink} hard links"
    elif st.st_uid not in _owners(owner):
        problem = f"belongs to uid {st.st_uid}, not the directory's owner"
    if problem:
        os.close(fd)
        raise _refuse(path, problem)
    return fd


def dir_owner(path: Path) -> int:
    """The owner of directory ``path`` itself (a symbolic link is refused)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, "is a symbolic link")
    return st.st_uid


def read_bytes(
    path: Path,
    *,
    owner: int | None = None,
    limit: int = 1 << 20,
    whole: bool = False,
    head: bool = False,
) -> bytes:
    """At most ``limit`` bytes of ``path``: its last ones when it is longer (a log's tail),
    its first ones with ``head``, or, with ``whole``, an error (a file to be rewritten is
    never cut)."""
    with open_dir(path.parent, owner) as dfd:
        fd = _open_in(dfd, path.name, os.O_RDONLY, path, owner)
        try:
            size = os.fstat(fd).st_size
            if size > limit and whole:
                raise OSError(errno.EFBIG, f"{path} is larger than {limit} bytes")
            if size > limit and not head:
                os.lseek(fd, size - limit, os.SEEK_SET)
            chunks: list[bytes] = []
            left = limit
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 16))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)


def read_text(
    path: Path, *, owner: int | None = None, limit: int = 1 << 20, whole: bool = False
) -> str:
    return read_bytes(path, owner=owner, limit=limit, whole=whole).decode(errors="replace")


def tail_lines(path: Path, lines: int, *, owner: int | None = None, limit: int = 64 << 10) -> str:
    """The last ``lines`` lines of at most the last ``limit`` bytes of ``path``."""
    text = read_text(path, owner=owner, limit=limit)
    return "\n".join(text.splitlines()[-lines:])


def replace_text(
    path: Path,
    text: str,
    *,
    owner: int | None = None,
    chown: tuple[int, int] | None = None,
    mode: int = 0o600,
) -> None:
    """``path`` holds ``text`` afterwards: a new file (``chown``, ``mode``) renamed over it.

    Whatever was at ``path`` (a file, a symbolic link) is replaced, never followed.
    """
    with open_dir(path.parent, owner) as dfd:
        tmp = f".{path.name}.knobtune-{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FILE_FLAGS, mode, dir_fd=dfd)
        try:
            try:
                if chown is not None and os.geteuid() == 0:
                    os.fchown(fd, *chown)
                os.fchmod(fd, mode)
                data = text.encode()
                while data:
                    data = data[os.write(fd, data) :]
            finally:
                os.close(fd)
            os.rename(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise


def rewrite_in_place(path: Path, text: str, *, owner: int | None = None) -> None:
    """Overwrite the existing regular file ``path`` with ``text``, keeping its owner and
    mode (a configuration file PostgreSQL reads as its owner)."""
    with open_dir(path.parent, owner) as dfd:
        fd = _open_in(dfd, path.name, os.O_WRONLY, path, owner)
        try:
            data = text.encode()
            os.ftruncate(fd, 0)
            while data:
                data = data[os.write(fd, data) :]
        finally:
            os.close(fd)


def create_file(path: Path, *, chown: tuple[int, int] | None = None, mode: int = 0o600) -> None:
    """Make ``path`` as an empty file when nothing is there (a log another user appends to)."""
    with open_dir(path.parent) as dfd:
        try:
            fd = os.open(
                path.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FILE_FLAGS, mode, dir_fd=dfd
            )
        except FileExistsError:
            st = os.stat(path.name, dir_fd=dfd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                # ours to remove: the directory is ours (open_dir checked)
                os.unlink(path.name, dir_fd=dfd)
                create_file(path, chown=chown, mode=mode)
            return
        try:
            if chown is not None and os.geteuid() == 0:
                os.fchown(fd, *chown)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
