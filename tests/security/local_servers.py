"""Servers on the service's own host, as a hostile client would find them (issue 40).

``trust_cluster``: a disposable PostgreSQL on loopback (its own port and socket
directory) that trusts every local connection, as a host's own PostgreSQL often does. It
is made like a sandbox but handed over at once (``keep``), so the service does not know
it as one of its own: to knobtune it is just a server on 127.0.0.1. Never the host's
:5432.

``FakeServer``: a loopback port that answers like PostgreSQL asking for a clear-text
password, and records every byte a client sends (what libpq would hand over), or that
greets with a banner (what a port scanner would read).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg

from app.postgres.sandbox import Sandbox
from app.settings import Settings

TRUST_HBA = """# every local connection trusted, as on many hosts' own PostgreSQL
local   all   all                 trust
host    all   all   127.0.0.1/32  trust
"""

# roles of the trust cluster: (name, what it gets besides LOGIN)
ROLES = {
    "app": "",  # least privileged: a workload role
    "reader": "GRANT pg_read_server_files TO reader",
    "runner": "GRANT pg_execute_server_program TO runner",
    "maker": "ALTER ROLE maker CREATEROLE",  # before PostgreSQL 16: may grant itself those
}


@contextlib.contextmanager
def trust_cluster() -> Iterator[Sandbox]:
    sb = Sandbox.create()
    try:
        sb.keep()  # not this process's sandbox any more: nothing marks it as knobtune's own
        (sb.data_dir / "pg_hba.conf").write_text(TRUST_HBA)
        with psycopg.connect(sb.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
            for name, extra in ROLES.items():
                conn.execute(f"CREATE ROLE {name} LOGIN")
                if extra:
                    conn.execute(extra)
            conn.execute("GRANT CREATE ON SCHEMA public TO app")
        yield sb
    finally:
        sb.destroy()


def settings_for(tmp: Path, **settings: Any) -> Settings:
    """The service's settings in ``tmp``; settings this version does not have are left
    out, so that a test fails on an older version for what it shows, not on a name."""
    known = {k: v for k, v in settings.items() if k in Settings.model_fields}
    return Settings(database_url=f"sqlite:///{tmp / 'm.db'}", work_dir=tmp, **known)


def trust_dsn(sb: Sandbox, user: str = "postgres", host: str = "127.0.0.1") -> str:
    """A DSN of the trust cluster without a password (none is asked)."""
    return f"host={host} port={sb.port} user={user} dbname=postgres connect_timeout=5"


SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104


class FakeServer:
    """A loopback port; ``banner=None``: PostgreSQL's side of a startup that asks for a
    clear-text password, else the banner is sent at once. ``received`` holds every byte
    clients sent (all connections)."""

    def __init__(self, banner: bytes | None = None) -> None:
        self.banner = banner
        self.received = bytearray()
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(8)
        self.port = int(self._sock.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> FakeServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        self._thread.join(timeout=5)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            if self._stop.is_set():
                conn.close()
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> bytes:
        try:
            data = conn.recv(65536)
        except OSError:
            return b""
        with self._lock:
            self.received += data
        return data

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(3)
            if self.banner is not None:
                conn.sendall(self.banner)
                while self._read(conn):
                    pass
                return
            packet = self._read(conn)
            while len(packet) >= 8 and struct.unpack("!I", packet[4:8])[0] in (
                SSL_REQUEST,
                GSSENC_REQUEST,
            ):
                conn.sendall(b"N")  # no TLS, no GSS encryption: go on in the clear
                packet = self._read(conn)
            if not packet:
                return
            # the startup message: ask for a clear-text password, then keep what comes
            conn.sendall(b"R" + struct.pack("!II", 8, 3))
            while self._read(conn):
                pass

    def got(self, secret: str) -> bool:
        with self._lock:
            return secret.encode() in bytes(self.received)
