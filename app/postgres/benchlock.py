"""One knobtune benchmark per host at a time: a host-wide lock around each benchmark run.

Two sessions on two sandboxes of one 2-core host measure each other (issue 29: one
claimed "+34%, confirmed" from a final check run while the other session was going). So
benchmarks on targets that share a host take a turn first: ``slots`` turns per host
(``KNOBTUNE_BENCH_PER_HOST``, 1 by default; more on hosts with the cores for it).

Why file locks (``flock``) in a directory, not a lease in the metadata DB:

* the kernel releases a lock the moment its process dies (a crash leaves no stale lease
  to time out, and a SIGKILLed service never blocks the next one's benchmarks);
* they work between threads of one process (every turn opens its own file description)
  and between service processes on the host that share the directory
  (``KNOBTUNE_BENCH_LOCK_DIR``, default ``<work_dir>/locks``), with no DB round trip per run;
* what they guard is a host's CPUs and disks, which is what a directory on that host
  shares; service processes on other hosts do not load this one's CPUs.

The host of a target: every local target (sandboxes, servers on this host) is "local";
a remote one is its DSN's host, so two targets on one remote server take turns too.
A turn says whether it had to wait and for whom, and whether it ran beside another
knobtune benchmark (several slots): the session notes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from psycopg.conninfo import conninfo_to_dict

from app.postgres.dsn import is_local

POLL_S = 0.1


@dataclass
class BenchTurn:
    """How one benchmark got its turn on its host."""

    waited_s: float = 0.0
    waited_for: list[str] = field(default_factory=list)  # holders seen while waiting
    beside: list[str] = field(default_factory=list)  # other benchmarks running meanwhile

    def text(self) -> str | None:
        """A note for the session, or None when the run had the host to itself."""
        parts = []
        if self.waited_s >= 0.5:
            who = f" ({', '.join(self.waited_for)})" if self.waited_for else ""
            parts.append(
                f"waited {self.waited_s:.0f} s for another knobtune benchmark on this host{who}"
            )
        if self.beside:
            parts.append(
                f"ran beside another knobtune benchmark on this host ({', '.join(self.beside)}): "
                "its figures carry that load"
            )
        return "; ".join(parts) or None


def host_key(dsn: str) -> str:
    """Targets with the same key share a host: "local", or the DSN's host."""
    if is_local(dsn):
        return "local"
    try:
        host = str(conninfo_to_dict(dsn).get("host") or "local")
    except Exception:  # an unparsable DSN fails elsewhere, with its own message
        return "unknown"
    return host.split(",")[0].strip().lower() or "local"


class HostBenchLock:
    """``slots`` benchmark turns on one host, shared by threads and processes (module doc)."""

    def __init__(self, lock_dir: Path, host: str, *, slots: int = 1, holder: str = "") -> None:
        self.dir = Path(lock_dir)
        self.host = host
        self.slots = max(1, slots)
        self.holder = holder or f"pid {os.getpid()}"
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", host)[:80]
        self.paths = [self.dir / f"bench-{safe}-{i}.lock" for i in range(self.slots)]

    def _try(self, path: Path) -> IO[str] | None:
        f = path.open("a+")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            return None
        return f

    @staticmethod
    def _holder_of(path: Path) -> str:
        try:
            return path.read_text().strip() or "another process"
        except OSError:
            return "another process"

    def _others(self, mine: Path) -> list[str]:
        """Holders of the other slots now (a slot that cannot be taken is held)."""
        out = []
        for path in self.paths:
            if path == mine:
                continue
            f = self._try(path)
            if f is None:
                out.append(self._holder_of(path))
            else:
                f.close()
        return out

    @contextlib.contextmanager
    def turn(self, stop: threading.Event | None = None) -> Iterator[BenchTurn]:
        """Hold a slot for the block; waits (a set ``stop`` ends the wait, unlocked)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        info = BenchTurn()
        t0 = time.monotonic()
        held: IO[str] | None = None
        mine: Path | None = None
        while held is None:
            for path in self.paths:
                held = self._try(path)
                if held is not None:
                    mine = path
                    break
            if held is not None or (stop is not None and stop.is_set()):
                break
            for path in self.paths:
                who = self._holder_of(path)
                if who not in info.waited_for:
                    info.waited_for.append(who)
            if stop is not None:
                stop.wait(POLL_S)
            else:
                time.sleep(POLL_S)
        info.waited_s = time.monotonic() - t0
        try:
            if held is not None and mine is not None:
                held.seek(0)
                held.truncate()
                held.write(self.holder)
                held.flush()
                info.beside = self._others(mine)
            yield info
        finally:
            if held is not None and mine is not None:
                # and those that started while this one ran
                for who in self._others(mine):
                    if who not in info.beside:
                        info.beside.append(who)
            if held is not None:
                held.close()  # releases the lock


def lock_for(
    dsn: str, *, lock_dir: Path | None, work_dir: Path, slots: int, holder: str
) -> HostBenchLock:
    """The benchmark lock of ``dsn``'s host (``lock_dir`` default: <work_dir>/locks)."""
    return HostBenchLock(
        lock_dir or Path(work_dir) / "locks", host_key(dsn), slots=slots, holder=holder
    )


@contextlib.contextmanager
def maybe_turn(
    lock: HostBenchLock | None, stop: threading.Event | None = None
) -> Iterator[BenchTurn | None]:
    """A turn of ``lock``, or no lock at all (None: a caller outside the service)."""
    if lock is None:
        yield None
        return
    with lock.turn(stop) as turn:
        yield turn
