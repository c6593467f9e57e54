"""Captured logs at rest: gzip, then Fernet with the service's key, in a private file.

A capture's log holds the statements a server ran, with their literal values: the user's
data. It never goes into the metadata DB (a dump or a replica of it would carry it); it
is ``<work_dir>/captures/<id>.log.gz.fernet``, mode 0600 in a 0700 directory under the
private work directory, compressed and then encrypted with the key that seals the stored
DSNs (app/vault.py). The file is named by the capture's id only: no client text reaches a
path. Deleting a capture deletes its file.

:func:`load_log` is the loader the replay workload gets (``app.workloads`` cannot import
this package: it sits below it); app/main.py hands it over at start.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import threading
import zlib
from pathlib import Path

from app import vault

CAPTURES_DIR = "captures"
SUFFIX = ".log.gz.fernet"
GZIP_MAGIC = b"\x1f\x8b"

_lock = threading.Lock()
_work_dir: Path | None = None


class CaptureTooLarge(Exception):
    """More log text than KNOBTUNE_CAPTURE_MAX_BYTES allows."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the log is larger than {limit} bytes of text (KNOBTUNE_CAPTURE_MAX_BYTES); "
            "import a shorter stretch of it, or raise the setting"
        )
        self.limit = limit


class CaptureUnreadable(Exception):
    """The capture's file is missing or cannot be decrypted; the message says which."""


def configure(work_dir: Path) -> None:
    """The work directory :func:`load_log` reads from (the running service's)."""
    global _work_dir
    with _lock:
        _work_dir = Path(work_dir)


def _default_work_dir() -> Path:
    with _lock:
        if _work_dir is not None:
            return _work_dir
    from app.settings import get_settings

    return get_settings().work_dir


def captures_dir(work_dir: Path) -> Path:
    """``<work_dir>/captures``, made private (0700) if needed."""
    path = Path(work_dir) / CAPTURES_DIR
    vault.private_dir(path)
    return path


def path_for(work_dir: Path, capture_id: int) -> Path:
    return Path(work_dir) / CAPTURES_DIR / f"{int(capture_id)}{SUFFIX}"


def write_log(work_dir: Path, capture_id: int, text: str) -> int:
    """Store ``text`` as the capture's log (replacing any); returns the file's size."""
    sealed = vault.encrypt_bytes(gzip.compress(text.encode("utf-8"), compresslevel=6))
    folder = captures_dir(work_dir)
    final = path_for(work_dir, capture_id)
    tmp = folder / f".{int(capture_id)}.{os.getpid()}.{threading.get_ident()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(sealed)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return len(sealed)


def read_log(work_dir: Path, capture_id: int) -> str:
    """The capture's log text; CaptureUnreadable when its file is gone or sealed with
    a key this service no longer has."""
    path = path_for(work_dir, capture_id)
    try:
        sealed = path.read_bytes()
    except FileNotFoundError:
        raise CaptureUnreadable(f"capture {capture_id} has no stored log") from None
    try:
        packed = vault.decrypt_bytes(sealed)
    except ValueError:
        raise CaptureUnreadable(
            f"capture {capture_id}'s log cannot be decrypted with this service's secret key "
            "(KNOBTUNE_SECRET_KEY or <work dir>/secret.key was replaced)"
        ) from None
    return gzip.decompress(packed).decode("utf-8", errors="replace")


def read_gzip(work_dir: Path, capture_id: int) -> bytes:
    """The capture's log, gzip-compressed (a download), without decompressing it here."""
    path = path_for(work_dir, capture_id)
    try:
        return vault.decrypt_bytes(path.read_bytes())
    except FileNotFoundError:
        raise CaptureUnreadable(f"capture {capture_id} has no stored log") from None
    except ValueError:
        raise CaptureUnreadable(
            f"capture {capture_id}'s log cannot be decrypted with this service's secret key"
        ) from None


def delete_log(work_dir: Path, capture_id: int) -> bool:
    """Remove the capture's file; whether there was one."""
    try:
        path_for(work_dir, capture_id).unlink()
    except FileNotFoundError:
        return False
    return True


def load_log(capture_id: int, *, work_dir: Path | None = None) -> str:
    """The log text of a capture, for the replay workload (its capture loader)."""
    return read_log(work_dir or _default_work_dir(), capture_id)


def decode_upload(body: bytes, limit: int) -> str:
    """An uploaded log as text: gzip (by its magic bytes) or plain, at most ``limit`` bytes
    of text after decompression (a gzip bomb stops at the limit); CaptureTooLarge beyond."""
    if body[:2] == GZIP_MAGIC:
        out = bytearray()
        data = body
        try:
            while data[:2] == GZIP_MAGIC:  # one member after another (`cat a.gz b.gz`)
                d = zlib.decompressobj(wbits=31)
                while data and not d.eof:
                    out += d.decompress(data, limit + 1 - len(out))
                    if len(out) > limit:
                        raise CaptureTooLarge(limit)
                    data = d.unconsumed_tail
                if not d.eof:
                    raise ValueError(
                        "the gzip data ends before its end marker (a truncated upload?)"
                    )
                data = d.unused_data
        except zlib.error:
            raise ValueError("the body starts like gzip but is not valid gzip data") from None
        raw = bytes(out)
    else:
        raw = body
    if len(raw) > limit:
        raise CaptureTooLarge(limit)
    return raw.decode("utf-8", errors="replace")
