"""Secrets at rest: the key that encrypts stored DSNs, and the service's private files.

Stored DSNs (their passwords) are encrypted with Fernet (AES-128-CBC + HMAC-SHA256,
from ``cryptography``). Where the key comes from:

- ``KNOBTUNE_SECRET_KEY`` (one Fernet key, or several separated by commas: the first
  encrypts, all decrypt, which is how a key is rotated). Deployments set it from their
  secret store, so a copy of the metadata DB (a backup, a dump, a read replica) holds
  no usable password.
- Otherwise, the embedded default generates one key on first start into
  ``<work_dir>/secret.key`` (mode 0600, created exclusively, never overwritten) and
  reads it from there afterwards. Why not refuse to start without a key: knobtune's
  first use is ``knobtune demo`` / ``knobtune tune`` on a laptop, with nothing to
  configure. Why not keep the key in the DB: it would sit beside what it protects. A
  file beside the SQLite DB is not a hardware secret store either, but it keeps
  passwords out of the DB file, its WAL, its dumps and backups, and both files are
  private to the service's user. Losing the file makes the stored passwords
  unreadable: those targets are shown as needing to be registered again.

Every key ever loaded by this process can decrypt (tests and the CLI run several
services in one process, each with its own work directory); the last configured key
encrypts.

Files: the work directory is private to the service's user (0700; 0711 when a root
service keeps managed sandboxes in it, whose ``postgres`` OS user must reach its own
directory below: it can enter, but list or read nothing), the key file and a SQLite
metadata DB with its -wal/-shm are 0600. A sandbox's superuser runs as ``postgres``
and so cannot ``pg_read_binary_file`` any of them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from sqlalchemy.engine import make_url

log = logging.getLogger(__name__)

PREFIX = "fernet:"  # marks an encrypted value; anything else is legacy plain text
KEY_FILE = "secret.key"
SECRET_KEY_ENV = "KNOBTUNE_SECRET_KEY"  # noqa: S105 - the variable's name
UNREADABLE = "knobtune:undecryptable"  # what a value that no known key opens reads as

_lock = threading.Lock()
_primary: Fernet | None = None
_all: list[Fernet] = []
_seen: set[str] = set()


class SecretKeyError(RuntimeError):
    """The configured key is unusable; the message says what to change."""


def _parse(keys: str) -> list[tuple[str, Fernet]]:
    out: list[tuple[str, Fernet]] = []
    for k in (x.strip() for x in keys.split(",")):
        if not k:
            continue
        try:
            out.append((k, Fernet(k.encode())))
        except (ValueError, TypeError):
            raise SecretKeyError(
                f"{SECRET_KEY_ENV} is not a Fernet key (32 url-safe base64-encoded bytes); "
                'make one with: python -c "from cryptography.fernet import Fernet; '
                'print(Fernet.generate_key().decode())"'
            ) from None
    return out


def key_file_key(work_dir: Path) -> str:
    """The key in ``<work_dir>/secret.key``, generated (0600, exclusively) when absent."""
    path = Path(work_dir) / KEY_FILE
    private_work_dir(Path(work_dir))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(Fernet.generate_key().decode() + "\n")
        log.info(
            "generated a secret key for stored passwords in %s (set %s to use your own)",
            path,
            SECRET_KEY_ENV,
        )
    os.chmod(path, 0o600)
    return path.read_text().strip()


def configure(secret_key: str | None, work_dir: Path) -> None:
    """Load the service's key(s): ``secret_key`` if given, else the work directory's file."""
    keys = _parse(secret_key) if secret_key else _parse(key_file_key(work_dir))
    if not keys:
        raise SecretKeyError(f"{SECRET_KEY_ENV} is empty; unset it or give a Fernet key")
    global _primary
    with _lock:
        _primary = keys[0][1]
        for text, k in keys:
            if text not in _seen:
                _seen.add(text)
                _all.append(k)


def _ensure() -> Fernet:
    if _primary is None:
        # Outside the service (a script using the models directly): its settings' key.
        from app.settings import get_settings

        s = get_settings()
        configure(s.secret_key.get_secret_value() if s.secret_key else None, s.work_dir)
    assert _primary is not None
    return _primary


def encrypt(text: str) -> str:
    primary = _ensure()
    return PREFIX + primary.encrypt(text.encode()).decode()


def is_encrypted(stored: str) -> bool:
    return stored.startswith(PREFIX)


def decrypt(stored: str) -> str:
    """The plain text of a stored value; legacy plain text is returned as it is."""
    if not is_encrypted(stored):
        return stored
    primary = _ensure()
    token = stored[len(PREFIX) :].encode()
    with _lock:
        keys = [primary, *[k for k in _all if k is not primary]]
    try:
        return MultiFernet(keys).decrypt(token).decode()
    except InvalidToken:
        return UNREADABLE


def encrypt_bytes(data: bytes) -> bytes:
    """``data`` encrypted with the service's key (a Fernet token: captured logs at rest)."""
    return _ensure().encrypt(data)


def decrypt_bytes(token: bytes) -> bytes:
    """The plain bytes of :func:`encrypt_bytes`'s token; raises ValueError when no known
    key opens it (the key was lost or replaced)."""
    primary = _ensure()
    with _lock:
        keys = [primary, *[k for k in _all if k is not primary]]
    try:
        return MultiFernet(keys).decrypt(token)
    except InvalidToken:
        raise ValueError("no configured secret key decrypts it") from None


# -- private files -----------------------------------------------------------------------
def private_dir(path: Path, *, hosts_sandboxes: bool = False) -> None:
    """Create ``path`` if needed and make it the service user's alone (see module doc)."""
    path.mkdir(parents=True, exist_ok=True)
    root_with_sandboxes = hosts_sandboxes and os.geteuid() == 0
    os.chmod(path, 0o711 if root_with_sandboxes else 0o700)


def private_work_dir(work_dir: Path) -> None:
    """The work directory 0700 (0711 as root: sandboxes below it belong to ``postgres``)."""
    as_root = os.geteuid() == 0
    private_dir(work_dir, hosts_sandboxes=as_root)
    sandboxes = work_dir / "sandboxes"
    if sandboxes.exists() or as_root:
        private_dir(sandboxes, hosts_sandboxes=as_root)


def sqlite_path(url: str) -> Path | None:
    parsed = make_url(url)
    db = parsed.database
    if not parsed.drivername.startswith("sqlite") or not db or db == ":memory:":
        return None
    if db.startswith("file:"):
        return None
    return Path(db)


def private_sqlite(url: str) -> None:
    """A SQLite metadata DB file (and its -wal/-shm/-journal) readable by its owner only.

    The file is created 0600 before SQLite opens it: SQLite gives the -wal and -shm files
    the main file's mode, so they are private from their first byte.
    """
    path = sqlite_path(url)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    for suffix in ("", "-wal", "-shm", "-journal"):
        p = Path(f"{path}{suffix}")
        with contextlib.suppress(FileNotFoundError):
            os.chmod(p, 0o600)
