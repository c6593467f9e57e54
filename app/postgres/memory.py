"""What a local server's memory really is, read while it runs (the measured memory guard).

Two sources, the first that applies:

* **its cgroup**, when one limits its memory (a sandbox's profile, a container, a systemd
  unit with ``MemoryMax``): the cgroup's own accounting, which is what its OOM killer acts
  on. Non-reclaimable memory is the anonymous memory plus shmem (cgroup v1 ``memory.stat``:
  ``total_rss`` + ``total_shmem``; v2: ``anon`` + ``shmem``); the page cache is reclaimed
  before anything is killed, so it is not counted. The limit is the cgroup's.
* **the postmaster's process tree** otherwise: the sum of the processes' proportional set
  sizes (``/proc/<pid>/smaps_rollup``: ``Pss_Anon`` and ``Pss_Shmem``, so a shared page is
  counted once over the tree), against the host's RAM.

A server on another host has no meter: its guard is the static model against its declared
RAM (optimizer/guard.py). Reading either source costs well under a millisecond a process,
so a run reads it every second (the live guard).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.postgres import cgroups
from optimizer.guard import MemoryUse

log = logging.getLogger(__name__)

PROC = Path("/proc")
_ROLLUP = re.compile(r"^(\w+):\s+(\d+) kB$", re.M)  # smaps_rollup's "Pss_Anon:   116 kB"


@dataclass(frozen=True)
class Reading:
    use: MemoryUse
    limit_bytes: int  # what the server may use: its cgroup's limit, else the host's RAM
    source: str  # "cgroup <path>" or "PSS of N processes"


def _stat(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            out[key] = int(value)
    return out


def memory_cgroup_dir(
    pid: int, *, proc: Path = PROC, root: Path = cgroups.CGROUP_ROOT
) -> Path | None:
    """The directory of ``pid``'s memory cgroup (v1's memory controller, or v2's), or None."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, ctrls, path = parts
        if "memory" in ctrls.split(","):
            return root / "memory" / path.lstrip("/")
        if not ctrls and (root / path.lstrip("/") / "memory.max").exists():
            return root / path.lstrip("/")
    return None


def cgroup_use(directory: Path) -> MemoryUse | None:
    """Non-reclaimable memory of a cgroup (v1 or v2), or None if unreadable."""
    try:
        stat = _stat((directory / "memory.stat").read_text())
    except OSError:
        return None
    if "total_rss" in stat:  # v1, hierarchical totals
        return MemoryUse(stat["total_rss"], stat.get("total_shmem", 0))
    if "anon" in stat:  # v2 (always hierarchical)
        return MemoryUse(stat["anon"], stat.get("shmem", 0))
    return None


def _children(proc: Path) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def tree_use(pid: int, *, proc: Path = PROC) -> tuple[MemoryUse, int] | None:
    """PSS of the postmaster ``pid`` and its children (anon, shmem), and how many processes."""
    kids = _children(proc)
    todo, seen = [pid], 0
    anon = shmem = 0
    while todo:
        p = todo.pop()
        try:
            text = (proc / str(p) / "smaps_rollup").read_text()
        except OSError:
            continue
        fields = {k: int(v) for k, v in _ROLLUP.findall(text)}  # kB
        seen += 1
        anon += fields.get("Pss_Anon", fields.get("Private_Dirty", 0)) * 1024
        shmem += fields.get("Pss_Shmem", 0) * 1024
        todo.extend(kids.get(p, []))
    if not seen:
        return None
    return MemoryUse(anon, shmem), seen


def host_ram(proc: Path = PROC) -> int | None:
    try:
        return cgroups.meminfo_total((proc / "meminfo").read_text())
    except OSError:
        return None


class MemoryMeter:
    """Reads a local server's memory; ``find_pid`` gives the postmaster's pid (again after a
    restart, when the last one is gone)."""

    def __init__(self, find_pid: Callable[[], int | None], *, proc: Path = PROC) -> None:
        self._find_pid, self._proc = find_pid, proc
        self._pid: int | None = None
        self._limit: tuple[int, Path | None, int] | None = None  # pid, cgroup dir, limit

    def _postmaster(self) -> int | None:
        if self._pid is not None and (self._proc / str(self._pid)).exists():
            return self._pid
        try:
            self._pid = self._find_pid()
        except Exception:  # the server is down or restarting: no reading this second
            self._pid = None
        return self._pid

    def read(self) -> Reading | None:
        """The server's memory now, or None when it cannot be read (down, not ours)."""
        pid = self._postmaster()
        if pid is None:
            return None
        if self._limit is None or self._limit[0] != pid:
            found = cgroups.limits_of_pid(pid, proc=self._proc)
            directory = memory_cgroup_dir(pid, proc=self._proc) if found.memory_bytes else None
            limit = cgroups.smaller(found.memory_bytes, host_ram(self._proc)) or 0
            self._limit = (pid, directory, limit)
        _, directory, limit = self._limit
        if limit <= 0:
            return None
        if directory is not None:
            use = cgroup_use(directory)
            if use is not None:
                return Reading(use, limit, f"cgroup {directory}")
        tree = tree_use(pid, proc=self._proc)
        if tree is None:
            return None
        return Reading(tree[0], limit, f"PSS of {tree[1]} processes")
