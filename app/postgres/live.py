"""The sandboxes this process made and still owns (destroyed when it exits).

app/postgres/sandbox.py adds and removes them; app/postgres/connect.py reads them (a
connection to one goes to the service's own cluster: always allowed). A module of its
own, below both, so that connect.py need not import sandbox.py, which connects through
connect.py.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Protocol


class LiveSandbox(Protocol):
    """What connect.py reads of a sandbox, and what the exit handler calls."""

    @property
    def port(self) -> int: ...

    @property
    def socket_dir(self) -> Path: ...

    @property
    def bench_password(self) -> str | None: ...

    def destroy(self) -> None: ...


_live: set[LiveSandbox] = set()
_lock = threading.Lock()


def add(sb: LiveSandbox) -> None:
    with _lock:
        _live.add(sb)


def discard(sb: LiveSandbox) -> None:
    with _lock:
        _live.discard(sb)


def snapshot() -> list[LiveSandbox]:
    """The live sandboxes now (a copy: others may be made or destroyed meanwhile)."""
    with _lock:
        return list(_live)
