"""Secrets at rest: the key that encrypts stored DSNs, and the service's private files.

Stored DSNs (their passwords) are encrypted with Fernet (AES-128-CBC + HMAC-SHA256,
from ``cryptography``). Where the key comes from:

- ``KNOBTUNE_SECRET_KEY`` (one Fernet key, or several separated by commas: the first
  encrypts, all decrypt, which is how a key is rotated). Deployments set it from their
  secret store, so a copy of the metadata DB (a backup, a dump, a read replica) holds
  no usable password.
- Otherwise ``KNOBTUNE_SECRET_KEY_FILE``: a file the operator names (created with a new
  key, 0600, when absent), for keys deployed as files.
- Otherwise, with the embedded SQLite metadata DB only, one key is generated on first
  start into ``<work_dir>/secret.key`` (mode 0600, created exclusively, never
  overwritten) and read from there afterwards. Why not refuse to start without a key:
  knobtune's first use is ``knobtune demo`` / ``knobtune tune`` on a laptop, with
  nothing to configure. Why not keep the key in the DB: it would sit beside what it
  protects. A file beside the SQLite DB is not a hardware secret store either, but it
  keeps passwords out of the DB file, its WAL, its dumps and backups, and both files
  are private to the service's user. A PostgreSQL metadata DB is made to be shared by
  several processes, each with its own work directory: a key generated per process
  would let none read another's DSNs, so there a key must be given (SecretKeyError).

Which keys the stored secrets need is recorded in the metadata DB (table
``secret_keys``): the fingerprint of each key that has encrypted there (an HMAC keyed by
the key, which tells nothing about it), recorded when a process first encrypts with it.
A process that lacks one of them refuses to start, naming the key and who first used
it (:func:`check_key`); before, a process with its own key claimed another's session and
crashed on the DSN it could not read, in a loop. A key that is lost for good is given up
with ``knobtune db adopt-key`` (:func:`adopt_key`): the DSNs it encrypted then read as
needing to be registered again.

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

import base64
import contextlib
import hashlib
import hmac
import logging
import os
import threading
from datetime import UTC, datetime
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError

log = logging.getLogger(__name__)

PREFIX = "fernet:"  # marks an encrypted value; anything else is legacy plain text
KEY_FILE = "secret.key"
SECRET_KEY_ENV = "KNOBTUNE_SECRET_KEY"  # noqa: S105 - the variable's name
KEY_FILE_ENV = "KNOBTUNE_SECRET_KEY_FILE"
UNREADABLE = "knobtune:undecryptable"  # what a value that no known key opens reads as

_lock = threading.Lock()
_primary: Fernet | None = None
_all: list[Fernet] = []
_seen: set[str] = set()


class SecretKeyError(RuntimeError):
    """The configured key is unusable; the message says what to change."""


def _parse(keys: str, source: str = SECRET_KEY_ENV) -> list[tuple[str, Fernet]]:
    out: list[tuple[str, Fernet]] = []
    for k in (x.strip() for x in keys.split(",")):
        if not k:
            continue
        try:
            out.append((k, Fernet(k.encode())))
        except (ValueError, TypeError):
            raise SecretKeyError(
                f"{source} is not a Fernet key (32 url-safe base64-encoded bytes); "
                'make one with: python -c "from cryptography.fernet import Fernet; '
                'print(Fernet.generate_key().decode())"'
            ) from None
    return out


def _create_key_file(path: Path) -> None:
    """A new key into ``path`` (0600, created exclusively: never overwrites a key)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(Fernet.generate_key().decode() + "\n")
    log.info(
        "generated a secret key for stored passwords in %s (set %s to use your own)",
        path,
        SECRET_KEY_ENV,
    )


def key_file_key(work_dir: Path) -> str:
    """The key in ``<work_dir>/secret.key``, generated (0600, exclusively) when absent."""
    path = Path(work_dir) / KEY_FILE
    private_work_dir(Path(work_dir))
    _create_key_file(path)
    os.chmod(path, 0o600)
    return path.read_text().strip()


def is_sqlite(database_url: str) -> bool:
    return make_url(database_url).drivername.startswith("sqlite")


def service_key(
    secret_key: str | None, key_file: Path | None, work_dir: Path, database_url: str
) -> tuple[str, str]:
    """The service's key text, and where it comes from (named in messages).

    ``KNOBTUNE_SECRET_KEY``, else ``KNOBTUNE_SECRET_KEY_FILE`` (created when absent), else,
    with a SQLite metadata DB only, ``<work_dir>/secret.key`` (generated when absent).
    """
    if secret_key:
        return secret_key, SECRET_KEY_ENV
    if key_file is not None:
        source = f"{KEY_FILE_ENV} ({key_file})"
        try:
            key_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            _create_key_file(key_file)
            keys = key_file.read_text().strip()
        except OSError as exc:
            raise SecretKeyError(
                f"cannot read the secret key from {source}: {exc.strerror or exc}; give a "
                f"readable file, or set {SECRET_KEY_ENV}"
            ) from None
        if not keys:
            raise SecretKeyError(f"{source} holds no key: put a Fernet key in it")
        return keys, source
    if not is_sqlite(database_url):
        raise SecretKeyError(
            f"a PostgreSQL metadata DB needs a secret key: set {SECRET_KEY_ENV} (every "
            f"process sharing the DB the same), or {KEY_FILE_ENV} to a file holding it (made "
            "with a new key when absent; copy it to the other processes' hosts). A key made "
            "per process, as with SQLite, would let no process read another's DSNs. Make a "
            'key with: python -c "from cryptography.fernet import Fernet; '
            'print(Fernet.generate_key().decode())"'
        )
    return key_file_key(work_dir), f"{work_dir / KEY_FILE} (generated; {SECRET_KEY_ENV} is unset)"


def configure(secret_key: str | None, work_dir: Path, source: str = SECRET_KEY_ENV) -> None:
    """Load the service's key(s): ``secret_key`` if given, else the work directory's file."""
    keys = _parse(secret_key, source) if secret_key else _parse(key_file_key(work_dir), source)
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
        given = s.secret_key.get_secret_value() if s.secret_key else None
        key, source = service_key(given, s.secret_key_file, s.work_dir, s.database_url)
        configure(key, s.work_dir, source)
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


# -- the keys the metadata DB's secrets need -----------------------------------------------
_FINGERPRINT_LABEL = b"knobtune secret key fingerprint v1"


def fingerprint(key: str) -> str:
    """A key's fingerprint: HMAC-SHA256 keyed by the key over a fixed label (hex).

    Stored in the metadata DB; without the key it tells nothing about it (a Fernet key is
    32 random bytes: nothing to guess).
    """
    raw = base64.urlsafe_b64decode(key.strip().encode())
    return hmac.new(raw, _FINGERPRINT_LABEL, hashlib.sha256).hexdigest()


def _refuse_unreadable(conn: Connection, keys: list[Fernet], source: str) -> None:
    """With no fingerprint recorded yet (a DB from before them): refuse keys that open
    none of the encrypted DSNs stored, since they were written with another key."""
    rows = conn.execute(
        text("SELECT dsn FROM targets WHERE dsn LIKE :p ORDER BY id LIMIT 50"),
        {"p": PREFIX + "%"},
    ).all()
    if not rows:
        return
    opener = MultiFernet(keys)
    for (value,) in rows:
        try:
            opener.decrypt(value[len(PREFIX) :].encode())
            return
        except InvalidToken:
            continue
    raise SecretKeyError(
        f"the metadata DB's stored DSNs were encrypted with another secret key than this "
        f"process's ({source}): give this process the key the other processes use "
        f"({SECRET_KEY_ENV}, or {KEY_FILE_ENV} naming a copy of their key file). If that "
        "key is lost for good, `knobtune db adopt-key` makes this one the DB's key (its "
        "targets must then be registered again)."
    )


def check_key(engine: Engine, keys: str, *, source: str, instance: str) -> None:
    """Refuse to start (SecretKeyError) unless ``keys`` hold every key that has encrypted
    secrets in this metadata DB; then record the first of them (the one that encrypts).

    ``keys`` is this process's key text (one key or several, comma-separated), ``source``
    where it came from, ``instance`` this process (recorded beside a new fingerprint).
    """
    parsed = _parse(keys, source)
    if not parsed:
        raise SecretKeyError(f"{source} is empty; give a Fernet key")
    ours = [fingerprint(t) for t, _ in parsed]
    for _attempt in range(3):
        try:
            with engine.begin() as conn:
                _one_at_a_time(conn)
                rows = conn.execute(
                    text(
                        "SELECT fingerprint, first_used_by, first_used_at FROM secret_keys "
                        "ORDER BY first_used_at"
                    )
                ).all()
                missing = [r for r in rows if r[0] not in ours]
                if missing:
                    fp, by, at = missing[0]
                    raise SecretKeyError(
                        f"this process's secret key ({source}, fingerprint {ours[0][:12]}) "
                        f"cannot read the metadata DB's secrets: {len(missing)} key(s) it "
                        f"lacks encrypted them, the first (fingerprint {fp[:12]}) first used "
                        f"by {by} at {str(at)[:19]}. Give every process sharing the DB the "
                        f"same key: {SECRET_KEY_ENV}, or {KEY_FILE_ENV} naming a copy of the "
                        "other processes' key file (to rotate, list the new key first and "
                        "the old after it). If that key is lost for good, `knobtune db "
                        "adopt-key` makes this one the DB's key (targets whose DSN it cannot "
                        "read must then be registered again)."
                    )
                if ours[0] in {r[0] for r in rows}:
                    return
                if not rows:
                    _refuse_unreadable(conn, [k for _, k in parsed], source)
                conn.execute(
                    text(
                        "INSERT INTO secret_keys (fingerprint, first_used_by, first_used_at) "
                        "VALUES (:fp, :by, :at)"
                    ),
                    {"fp": ours[0], "by": instance[:200], "at": _now()},
                )
            log.info("recorded secret key %s in the metadata DB (%s)", ours[0][:12], source)
            return
        except IntegrityError:  # pragma: no cover - the lock above makes it unlikely
            continue  # another process recorded the same key meanwhile: look again
    raise SecretKeyError("could not record the secret key's fingerprint; start again")


def adopt_key(engine: Engine, keys: str, *, source: str, instance: str) -> list[str]:
    """Make ``keys`` the metadata DB's keys, giving up the others (lost for good); returns
    the fingerprints given up. Secrets only those opened read as needing registration."""
    parsed = _parse(keys, source)
    if not parsed:
        raise SecretKeyError(f"{source} is empty; give a Fernet key")
    ours = {fingerprint(t) for t, _ in parsed}
    with engine.begin() as conn:
        _one_at_a_time(conn)
        stored = [r[0] for r in conn.execute(text("SELECT fingerprint FROM secret_keys"))]
        dropped = [fp for fp in stored if fp not in ours]
        for fp in dropped:
            conn.execute(text("DELETE FROM secret_keys WHERE fingerprint = :fp"), {"fp": fp})
        if fingerprint(parsed[0][0]) not in stored:
            conn.execute(
                text(
                    "INSERT INTO secret_keys (fingerprint, first_used_by, first_used_at) "
                    "VALUES (:fp, :by, :at)"
                ),
                {"fp": fingerprint(parsed[0][0]), "by": instance[:200], "at": _now()},
            )
    return dropped


def _one_at_a_time(conn: Connection) -> None:
    """Serialize the check: two processes with different keys starting on an empty DB at
    once must not both record theirs. Held until the transaction ends."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("LOCK TABLE secret_keys IN SHARE ROW EXCLUSIVE MODE"))
    else:  # SQLite: a write statement takes the DB's write lock (others wait, busy_timeout)
        conn.execute(text("UPDATE secret_keys SET fingerprint = fingerprint WHERE 1 = 0"))


def _now() -> datetime:
    # as app.models.UTCDateTime stores it: naive UTC
    return datetime.now(UTC).replace(tzinfo=None)


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
