"""Hardware profiles of sandboxes (Linux cgroups), and the limits a server really runs under.

Two halves:

* **Profiles.** A sandbox may run in a cgroup of its own (``knobtune-<name>``) that caps its
  memory (page cache included), its disk's IOPS and MB/s, and its CPUs, so that it behaves
  like a small server rather than like this host. cgroup v2 (``memory.max``, ``io.max``,
  ``cpu.max``) and v1 (``memory.limit_in_bytes`` and ``memory.memsw.limit_in_bytes``,
  ``blkio.throttle.{read,write}_{iops,bps}_device``, ``cpu.cfs_quota_us``) are detected.
  Every start of the sandbox's postmaster goes through :func:`launcher_argv`: this file run
  as a program, which writes its own pid to the cgroup's ``cgroup.procs`` files and then
  execs ``pg_ctl`` (no shell; the argv is ours), so the postmaster and every backend it
  forks are inside.
* **Detection.** The memory and CPUs a running server may use: the smaller of the host's
  and its cgroup's limits, read from ``/proc/<pid>/cgroup`` and the limit files (locally),
  or through ``pg_read_file`` (on another host) by :func:`limits_from_files`.

Only the standard library at module level: this file is also the launcher, run by path.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CGROUP_ROOT = Path("/sys/fs/cgroup")
PREFIXES = ("knobtune-", "kt-test-")
NAME_RE = r"^(knobtune|kt-test)-[A-Za-z0-9_.\-]{1,100}$"
MIB = 1024**2
GIB = 1024**3
MEMORY_FLOOR = 128 * MIB  # below this a PostgreSQL with default settings may not start
MAX_IOPS = 10_000_000
MAX_MBPS = 1_000_000
_V1_UNLIMITED = 1 << 62  # v1 reports "no limit" as a page-rounded LONG_MAX
_PERIOD_US = 100_000
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1024,
    "kib": 1024,
    "m": MIB,
    "mb": MIB,
    "mib": MIB,
    "g": GIB,
    "gb": GIB,
    "gib": GIB,
    "t": 1024**4,
    "tb": 1024**4,
    "tib": 1024**4,
}


class ProfileError(ValueError):
    """A profile or limit that is not valid (the message says what to give instead)."""


class CgroupUnavailable(RuntimeError):
    """Cgroups cannot be used here (not root, read-only, controller or device missing)."""


# -- limits and profiles ---------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """What a sandbox may use. ``None``: not limited. IOPS and MB/s cap reads and writes
    each (cgroups have no combined cap)."""

    memory_bytes: int | None = None
    disk_iops: int | None = None
    disk_mbps: int | None = None
    cpus: int | None = None
    profile: str | None = None  # the named profile these came from, if any

    @property
    def empty(self) -> bool:
        return not (self.memory_bytes or self.disk_iops or self.disk_mbps or self.cpus)

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "memory_bytes": self.memory_bytes,
            "disk_iops": self.disk_iops,
            "disk_mbps": self.disk_mbps,
            "cpus": self.cpus,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Limits | None:
        if not data:
            return None

        def num(key: str) -> int | None:
            v = data.get(key)
            return int(v) if v is not None else None

        profile = data.get("profile")
        return cls(
            memory_bytes=num("memory_bytes"),
            disk_iops=num("disk_iops"),
            disk_mbps=num("disk_mbps"),
            cpus=num("cpus"),
            profile=str(profile) if profile else None,
        )

    def describe(self) -> str:
        """'small (1GB memory, 1 CPU, 1000 IOPS, 100 MB/s)'."""
        text = self.figures()
        return f"{self.profile} ({text})" if self.profile else text

    def figures(self) -> str:
        """'1GB memory, 1 CPU, 1000 IOPS, 100 MB/s'."""
        parts = []
        if self.memory_bytes:
            parts.append(f"{format_size(self.memory_bytes)} memory")
        if self.cpus:
            parts.append(f"{self.cpus} CPU{'s' if self.cpus > 1 else ''}")
        if self.disk_iops:
            parts.append(f"{self.disk_iops} IOPS")
        if self.disk_mbps:
            parts.append(f"{self.disk_mbps} MB/s")
        return ", ".join(parts) or "no limits"

    def __str__(self) -> str:
        return self.describe()


@dataclass(frozen=True)
class Profile:
    name: str
    limits: Limits
    models: str  # what kind of server it looks like


def _profile(name: str, mem: int, cpus: int, iops: int, mbps: int, models: str) -> Profile:
    limits = Limits(memory_bytes=mem, disk_iops=iops, disk_mbps=mbps, cpus=cpus, profile=name)
    return Profile(name, limits, models)


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        _profile(
            "micro",
            512 * MIB,
            1,
            500,
            50,
            "the smallest cloud VMs (AWS t4g.nano-micro, a 512 MB droplet) on a "
            "throttled network disk",
        ),
        _profile(
            "small",
            1 * GIB,
            1,
            1000,
            100,
            "a 1 GB / 1 vCPU VM (AWS t3.micro, GCP e2-micro, a 1 GB droplet) on a "
            "1000-IOPS network disk",
        ),
        _profile(
            "medium",
            4 * GIB,
            2,
            3000,
            125,
            "a 4 GB / 2 vCPU VM (AWS t3.medium or m6g.medium with a gp3 volume at its "
            "baseline 3000 IOPS and 125 MB/s)",
        ),
        _profile(
            "large",
            8 * GIB,
            2,
            3000,
            250,
            "an 8 GB / 2 vCPU VM (AWS m6i.large, Azure D2s v5) on a gp3 volume with "
            "its throughput raised to 250 MB/s",
        ),
        # Managed instances, for a twin (docs/managed.md). vCPUs and memory: the RDS User
        # Guide's "Hardware specifications for DB instance classes" (db.t4g.micro 2 vCPU
        # 1 GiB, .small 2/2, .medium 2/4; db.m6g.large 2 vCPU 8 GiB). Disk: RDS gp3 below
        # 400 GiB allocated has a baseline of 3,000 IOPS and 125 MiB/s (RDS User Guide,
        # "Amazon RDS DB instance storage", gp3). A t4g's CPU credits are not modelled.
        *(
            _profile(
                name,
                gib * GIB,
                2,
                3000,
                125,
                f"Amazon RDS / Aurora {name} ({gib} GiB, 2 vCPUs) on gp3 storage under "
                "400 GiB (its baseline 3,000 IOPS and 125 MiB/s)",
            )
            for name, gib in (
                ("db.t4g.micro", 1),
                ("db.t4g.small", 2),
                ("db.t4g.medium", 4),
                ("db.m6g.large", 8),
            )
        ),
        # Cloud SQL custom machine type db-custom-<vCPUs>-<memory MB> (Cloud SQL docs,
        # "About instance settings": machine types). An SSD's performance scales with its
        # size: 30 IOPS per GB (reads and writes each) and 0.48 MB/s per GB (Cloud SQL
        # docs, "Storage options": SSD), so a 100 GB SSD gives 3,000 IOPS and 48 MB/s.
        _profile(
            "db-custom-1-3840",
            3840 * MIB,
            1,
            3000,
            48,
            "Cloud SQL db-custom-1-3840 (1 vCPU, 3,840 MB) on a 100 GB SSD (30 IOPS "
            "and 0.48 MB/s per GB: 3,000 IOPS, 48 MB/s)",
        ),
    )
}


def parse_size(value: str | int) -> int:
    """Bytes from ``1073741824``, ``"1GB"``, ``"512MB"``, ``"1.5GiB"`` (k/M/G/T are 1024-based,
    as in postgresql.conf). Raises ProfileError."""
    if isinstance(value, bool):
        raise ProfileError(f"a size like '1GB' or '512MB', not {value!r}")
    shown = repr(value if isinstance(value, int) else str(value)[:24])  # never a whole body
    if isinstance(value, int):
        n = value
    else:
        m = re.fullmatch(r"\s*(-?\d{1,20}(?:\.\d{1,20})?)\s*([A-Za-z]*)\s*", str(value)[:100])
        if m is None or m.group(2).lower() not in _UNITS:
            raise ProfileError(
                f"{shown} is not a size: give a number with kB, MB, GB or TB (1024-based, "
                "as in postgresql.conf), e.g. '1GB' or '512MB'"
            )
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise ProfileError(f"a size must be positive, not {shown}")
    return n


def format_size(n: int) -> str:
    for unit, size in (("TB", 1024**4), ("GB", GIB), ("MB", MIB), ("kB", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    if n >= GIB:
        return f"{n / GIB:.1f}GB"
    return f"{n // MIB}MB" if n >= MIB else f"{n}B"


def _host_ram() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def resolve(
    *,
    profile: str | None = None,
    memory: str | int | None = None,
    disk_iops: int | None = None,
    disk_mbps: int | None = None,
    cpus: int | None = None,
    host_ram: int | None = None,
    host_cpus: int | None = None,
) -> Limits:
    """The limits of a request: a named profile, explicit limits, or a profile with some of
    its limits replaced. Checked against this host (memory and CPUs it does not have cannot
    be emulated). Raises ProfileError."""
    base = Limits()
    if profile is not None:
        found = PROFILES.get(profile)
        if found is None:
            raise ProfileError(
                f"no profile {profile!r}; the profiles are: {', '.join(PROFILES)} "
                "(or give memory, disk_iops, disk_mbps and cpus yourself)"
            )
        base = found.limits
    mem = parse_size(memory) if memory is not None else base.memory_bytes
    iops = disk_iops if disk_iops is not None else base.disk_iops
    mbps = disk_mbps if disk_mbps is not None else base.disk_mbps
    ncpu = cpus if cpus is not None else base.cpus
    host_ram = host_ram or _host_ram()
    host_cpus = host_cpus or os.cpu_count() or 1
    if mem is not None:
        if mem < MEMORY_FLOOR:
            raise ProfileError(
                f"memory {format_size(mem)} is below {format_size(MEMORY_FLOOR)}: PostgreSQL "
                "needs that much to start and run a benchmark; give at least '128MB'"
            )
        if mem > host_ram:
            raise ProfileError(
                f"memory {format_size(mem)} is more than this host has "
                f"({host_ram / GIB:.1f} GB): a cgroup can only take memory away; give at "
                f"most {format_size(host_ram // MIB * MIB)}"
            )
    for field, value, top in (("disk_iops", iops, MAX_IOPS), ("disk_mbps", mbps, MAX_MBPS)):
        if value is not None and not (isinstance(value, int) and 1 <= value <= top):
            raise ProfileError(f"{field} must be a whole number from 1 to {top:,}, not {value!r}")
    if ncpu is not None:
        if not isinstance(ncpu, int) or isinstance(ncpu, bool) or ncpu < 1:
            raise ProfileError(f"cpus must be a whole number >= 1, not {ncpu!r}")
        if ncpu > host_cpus:
            raise ProfileError(
                f"cpus {ncpu} is more than this host has ({host_cpus}); give at most {host_cpus}"
            )
    changed = (memory, disk_iops, disk_mbps, cpus) != (None, None, None, None)
    name: str | None = None if profile is None else (f"{profile}+" if changed else profile)
    limits = Limits(mem, iops, mbps, ncpu, name)
    if limits.empty:
        raise ProfileError(
            "a sandbox object needs a profile or at least one of memory, disk_iops, "
            'disk_mbps, cpus; for no limits give "sandbox": true'
        )
    return limits


# -- the host's cgroups --------------------------------------------------------------


def block_device(path: Path) -> str:
    """``MAJ:MIN`` of the whole disk that holds ``path`` (a partition's parent disk).

    Raises CgroupUnavailable when ``path`` is not on a block device (tmpfs, overlay, NFS).
    """
    st = os.stat(path)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    sys_dev = Path(f"/sys/dev/block/{major}:{minor}")
    if not sys_dev.exists():
        raise CgroupUnavailable(
            f"{path} is not on a block device ({major}:{minor}: tmpfs, overlay or a network "
            "file system?), so its disk cannot be throttled; put the sandboxes "
            "(KNOBTUNE_SANDBOX_DIR) on a local disk, or omit disk_iops and disk_mbps"
        )
    real = sys_dev.resolve()
    if (real / "partition").exists():
        real = real.parent  # /sys/devices/.../sda/sda1 -> .../sda
    dev = (real / "dev").read_text().strip()
    if not re.fullmatch(r"\d+:\d+", dev):
        raise CgroupUnavailable(f"cannot read the device number of {real}")
    return dev


@dataclass(frozen=True)
class Host:
    """The host's cgroup layout: v1 (a directory per controller) or v2 (one unified tree)."""

    version: int
    root: Path

    @classmethod
    def detect(cls, root: Path | None = None) -> Host:
        """Raises CgroupUnavailable when neither layout has the controllers we need."""
        root = root or CGROUP_ROOT
        if (root / "memory" / "memory.limit_in_bytes").exists():
            return cls(1, root)
        if (root / "cgroup.controllers").exists():
            return cls(2, root)
        raise CgroupUnavailable(
            f"no cgroup controllers under {root} (neither v1's memory/ nor v2's "
            "cgroup.controllers): this host cannot cap a sandbox; mount cgroups there, or "
            'create the sandbox without limits ("sandbox": true)'
        )

    def controller_dirs(self, name: str, limits: Limits | None = None) -> list[Path]:
        """The directories of cgroup ``name`` (v1: one per controller the limits use)."""
        if self.version == 2:
            return [self.root / name]
        want = ["memory", "blkio", "cpu"]
        if limits is not None:
            want = [
                c
                for c, used in (
                    ("memory", limits.memory_bytes),
                    ("blkio", limits.disk_iops or limits.disk_mbps),
                    ("cpu", limits.cpus),
                )
                if used
            ]
        return [self.root / c / name for c in want]


def sandbox_cgroup_name(root: Path) -> str:
    """The cgroup name of the sandbox in ``root``: stable, so the same after a restart."""
    digest = hashlib.sha256(str(root.absolute()).encode()).hexdigest()[:8]
    stem = re.sub(r"[^A-Za-z0-9_.\-]", "_", root.name)[:40] or "sb"
    return f"knobtune-{stem}-{digest}"


def _write(path: Path, value: str) -> None:
    with path.open("w") as f:
        f.write(value)


def _unavailable(what: str, exc: OSError) -> CgroupUnavailable:
    why = exc.strerror or str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM) and os.geteuid() != 0:
        why += " (the service is not root)"
    elif exc.errno == errno.EROFS:
        why += " (cgroups are mounted read-only here, as in most containers)"
    return CgroupUnavailable(
        f"cannot {what}: {why}. Hardware profiles need writable cgroups: run the service "
        "as root on a host (or a privileged container) where /sys/fs/cgroup is writable, "
        'or create the sandbox without limits ("sandbox": true)'
    )


@dataclass(frozen=True)
class Cgroup:
    """One sandbox's cgroup, by name, on this host."""

    name: str
    host: Host

    @classmethod
    def for_sandbox(cls, root: Path, host: Host | None = None) -> Cgroup:
        """The cgroup of the sandbox in ``root`` (raises CgroupUnavailable without cgroups)."""
        return cls(sandbox_cgroup_name(root), host or Host.detect())

    def dirs(self) -> list[Path]:
        return [d for d in self.host.controller_dirs(self.name) if d.is_dir()]

    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs()]

    def pids(self) -> set[int]:
        out: set[int] = set()
        for f in self.procs_files():
            with contextlib.suppress(OSError):
                out |= {int(x) for x in f.read_text().split()}
        return out

    def exists(self) -> bool:
        return bool(self.dirs())

    def create(self, limits: Limits, data_dir: Path) -> None:
        """Make the cgroup (again) with ``limits`` on ``data_dir``'s disk; idempotent.

        Raises CgroupUnavailable (and leaves nothing behind) when it cannot be written.
        """
        if not re.fullmatch(NAME_RE, self.name):
            raise CgroupUnavailable(f"invalid cgroup name {self.name!r}")
        if limits.disk_iops or limits.disk_mbps:
            device: str | None = block_device(data_dir)
        else:  # only to lift the rules of an earlier profile, where a directory stays
            try:
                device = block_device(data_dir)
            except (CgroupUnavailable, OSError):
                device = None
        made: list[Path] = []
        try:
            if self.host.version == 2:
                self._enable_v2_controllers(limits)
            used = self.host.controller_dirs(self.name, limits)
            for d in self.host.controller_dirs(self.name):
                if d not in used and d.is_dir():  # a controller an earlier profile used
                    with contextlib.suppress(OSError):
                        d.rmdir()
            for d in used:
                if not d.parent.is_dir():
                    raise CgroupUnavailable(
                        f"the cgroup controller {d.parent.name!r} is not mounted at "
                        f"{d.parent}; mount it, or leave out the limit that needs it"
                    )
                try:
                    d.mkdir()
                    made.append(d)
                except FileExistsError:
                    pass
            if self.host.version == 1:
                self._write_v1(limits, device)
            else:
                self._write_v2(limits, device)
        except OSError as exc:
            for d in reversed(made):
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise _unavailable(f"set up cgroup {self.name} under {self.host.root}", exc) from None
        except CgroupUnavailable:
            for d in reversed(made):
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise

    def _write_v1(self, limits: Limits, device: str | None) -> None:
        """Every limit of the controllers in use: a cgroup made earlier with other limits
        (a changed profile) keeps none of its old ones."""
        root = self.host.root
        mem = root / "memory" / self.name
        if mem.is_dir():
            memsw = mem / "memory.memsw.limit_in_bytes"
            limit = str(limits.memory_bytes or -1)
            if memsw.exists():  # swap accounted: memsw >= limit at every step, then equal
                _write(memsw, "-1")
            _write(mem / "memory.limit_in_bytes", limit)
            if memsw.exists():  # so swap does not extend the limit
                _write(memsw, limit)
        blk = root / "blkio" / self.name
        if blk.is_dir() and device is not None:
            for kind, mult, value in (
                ("iops", 1, limits.disk_iops),
                ("bps", 1_000_000, limits.disk_mbps),
            ):
                for rw in ("read", "write"):  # 0 removes a rule
                    n = value * mult if value else 0
                    _write(blk / f"blkio.throttle.{rw}_{kind}_device", f"{device} {n}")
        cpu = root / "cpu" / self.name
        if cpu.is_dir():
            _write(cpu / "cpu.cfs_period_us", str(_PERIOD_US))
            quota = limits.cpus * _PERIOD_US if limits.cpus else -1
            _write(cpu / "cpu.cfs_quota_us", str(quota))

    def _enable_v2_controllers(self, limits: Limits) -> None:
        need = {"memory"} if limits.memory_bytes else set()
        if limits.disk_iops or limits.disk_mbps:
            need.add("io")
        if limits.cpus:
            need.add("cpu")
        root = self.host.root
        have = set((root / "cgroup.controllers").read_text().split())
        missing = need - have
        if missing:
            raise CgroupUnavailable(
                f"the cgroup v2 controller(s) {', '.join(sorted(missing))} are not available "
                f"in {root} (cgroup.controllers has: {' '.join(sorted(have)) or 'none'})"
            )
        enabled = set((root / "cgroup.subtree_control").read_text().split())
        for c in sorted(need - enabled):
            _write(root / "cgroup.subtree_control", f"+{c}")

    def _write_v2(self, limits: Limits, device: str | None) -> None:
        """The limits in use, and "max" where an earlier profile left one (a file there)."""
        d = self.host.root / self.name
        if limits.memory_bytes or (d / "memory.max").exists():
            _write(d / "memory.max", str(limits.memory_bytes or "max"))
            if limits.memory_bytes and (d / "memory.swap.max").exists():
                _write(d / "memory.swap.max", "0")
        disk = limits.disk_iops or limits.disk_mbps
        if device is not None and (disk or (d / "io.max").exists()):
            iops = str(limits.disk_iops or "max")
            bps = str(limits.disk_mbps * 1_000_000) if limits.disk_mbps else "max"
            _write(d / "io.max", f"{device} riops={iops} wiops={iops} rbps={bps} wbps={bps}")
        if limits.cpus or (d / "cpu.max").exists():
            quota = str(limits.cpus * _PERIOD_US) if limits.cpus else "max"
            _write(d / "cpu.max", f"{quota} {_PERIOD_US}")

    def remove(self, timeout_s: float = 5.0) -> bool:
        """Remove the cgroup (its processes must have exited: waits up to ``timeout_s``).

        Returns False when some directory stayed (a process still in it)."""
        deadline = time.monotonic() + timeout_s
        left = self.dirs()
        while left:
            for d in list(left):
                try:
                    d.rmdir()
                    left.remove(d)
                except FileNotFoundError:
                    left.remove(d)
                except OSError:
                    pass
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        return not left


def launcher_argv(
    procs_files: Sequence[Path],
    argv: Sequence[str],
    *,
    uid: int | None = None,
    gid: int | None = None,
    groups: Iterable[int] = (),
) -> list[str]:
    """argv that joins the cgroups (own pid into each ``cgroup.procs``), drops to
    ``uid``/``gid`` when given, then execs ``argv``. Run it as root; no shell involved."""
    out = [sys.executable, "-I", "-S", str(Path(__file__).resolve()), "join"]
    for f in procs_files:
        out += ["--procs", str(f)]
    if uid is not None and gid is not None:
        out += ["--uid", str(uid), "--gid", str(gid)]
        for g in groups:
            out += ["--group", str(g)]
    return [*out, "--", *argv]


def _launch(args: list[str]) -> int:
    """The launcher's main: ``join [--procs FILE]... [--uid U --gid G [--group G]...] -- argv``."""
    procs: list[str] = []
    uid = gid = None
    groups: list[int] = []
    if "--" not in args or not args or args[0] != "join":
        print("usage: cgroups.py join --procs FILE ... -- ARGV", file=sys.stderr)
        return 2
    sep = args.index("--")
    opts, argv = args[1:sep], args[sep + 1 :]
    it = iter(opts)
    for opt in it:
        val = next(it, None)
        if val is None:
            print(f"{opt} needs a value", file=sys.stderr)
            return 2
        if opt == "--procs":
            procs.append(val)
        elif opt == "--uid":
            uid = int(val)
        elif opt == "--gid":
            gid = int(val)
        elif opt == "--group":
            groups.append(int(val))
        else:
            print(f"unknown option {opt}", file=sys.stderr)
            return 2
    if not argv:
        print("nothing to run", file=sys.stderr)
        return 2
    for f in procs:
        p = Path(f)
        if p.name != "cgroup.procs" or not any(p.parent.name.startswith(x) for x in PREFIXES):
            print(f"refusing {f}: not the cgroup.procs of a knobtune cgroup", file=sys.stderr)
            return 2
        try:
            _write(p, str(os.getpid()))
        except OSError as exc:
            print(f"cannot join cgroup {p.parent}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    if uid is not None and gid is not None:
        os.setgroups(groups)
        os.setgid(gid)
        os.setuid(uid)
    try:
        os.execvp(argv[0], argv)  # noqa: S606 - our own argv, never a shell
    except OSError as exc:
        print(f"cannot run {argv[0]}: {exc.strerror or exc}", file=sys.stderr)
    return 127


# -- detection: the limits a running server has ------------------------------------------


@dataclass(frozen=True)
class Detected:
    """Limits found for a process (None: none found, or none readable)."""

    memory_bytes: int | None = None
    cpus: int | None = None
    source: str = ""  # where they were read, for notes


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    t = text.strip().split()
    if not t or t[0] == "max":
        return None
    try:
        return int(t[0])
    except ValueError:
        return None


def _walk(path: str) -> list[str]:
    """``/a/b`` -> ["/a/b", "/a", "/"]: a limit anywhere above a cgroup applies to it too."""
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[:i]) for i in range(len(parts), -1, -1)]


def limits_from_files(
    proc_cgroup: str, read: Callable[[str], str | None], root: str = str(CGROUP_ROOT)
) -> Detected:
    """The memory and CPU limits of a process whose ``/proc/<pid>/cgroup`` reads
    ``proc_cgroup``, reading limit files with ``read(path)`` (None: unreadable).

    v1 lines name their controllers (``4:memory:/a/b``), v2 has one (``0::/a/b``). Every
    level up to the root counts (the smallest limit wins): in a container with its own
    cgroup namespace the path is ``/`` and the limit is the mount's own file.
    """
    mem: list[int] = []
    quota: list[float] = []
    cpuset: list[int] = []
    sources: list[str] = []
    for line in proc_cgroup.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, ctrls, path = parts
        names = ctrls.split(",") if ctrls else []
        for level in _walk(path):
            rel = level.lstrip("/")
            if not names:  # v2
                base = f"{root}/{rel}".rstrip("/")
                m = _int(read(f"{base}/memory.max"))
                if m is not None:
                    mem.append(m)
                    sources.append(f"{base}/memory.max")
                cpu = read(f"{base}/cpu.max")
                if cpu is not None:
                    q = cpu.split()
                    if len(q) == 2 and q[0] != "max":
                        with contextlib.suppress(ValueError):
                            quota.append(int(q[0]) / int(q[1]))
                            sources.append(f"{base}/cpu.max")
                n = cpu_list_len(read(f"{base}/cpuset.cpus.effective"))
                if n:
                    cpuset.append(n)
            if "memory" in names:
                base = f"{root}/memory/{rel}".rstrip("/")
                m = _int(read(f"{base}/memory.limit_in_bytes"))
                if m is not None and m < _V1_UNLIMITED:
                    mem.append(m)
                    sources.append(f"{base}/memory.limit_in_bytes")
            if "cpu" in names:
                base = f"{root}/{ctrls}/{rel}".rstrip("/")
                q_us, p_us = (
                    _int(read(f"{base}/cpu.cfs_quota_us")),
                    _int(read(f"{base}/cpu.cfs_period_us")),
                )
                if q_us is not None and p_us and q_us > 0:
                    quota.append(q_us / p_us)
                    sources.append(f"{base}/cpu.cfs_quota_us")
            if "cpuset" in names:
                base = f"{root}/{ctrls}/{rel}".rstrip("/")
                n = cpu_list_len(read(f"{base}/cpuset.effective_cpus"))
                if n:
                    cpuset.append(n)
    cpus_from = [math.ceil(q - 1e-9) for q in quota] + cpuset
    return Detected(
        memory_bytes=min(mem) if mem else None,
        cpus=max(1, min(cpus_from)) if cpus_from else None,
        source=", ".join(dict.fromkeys(sources)),
    )


def cpu_list_len(text: str | None) -> int:
    """How many CPUs a list like ``0-3,6`` names (0: unreadable)."""
    if not text or not text.strip():
        return 0
    n = 0
    for part in text.strip().split(","):
        a, _, b = part.partition("-")
        try:
            n += int(b or a) - int(a) + 1
        except ValueError:
            return 0
    return n


def _read_local(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return None


def limits_of_pid(pid: int, *, proc: Path = Path("/proc"), root: Path | None = None) -> Detected:
    """The cgroup limits of a local process (nothing found: all None)."""
    text = _read_local(str(proc / str(pid) / "cgroup"))
    if text is None:
        return Detected()
    found = limits_from_files(text, _read_local, str(root or CGROUP_ROOT))
    try:
        affinity = len(os.sched_getaffinity(pid))
    except OSError:
        affinity = 0
    cpus = found.cpus
    if affinity:
        cpus = min(cpus, affinity) if cpus else affinity
    return Detected(found.memory_bytes, cpus, found.source)


def meminfo_total(text: str | None) -> int | None:
    """MemTotal of /proc/meminfo, in bytes."""
    m = re.search(r"^MemTotal:\s+(\d+)\s*kB", text or "", re.M)
    return int(m.group(1)) * 1024 if m else None


def cpuinfo_count(text: str | None) -> int | None:
    n = len(re.findall(r"^processor\s*:", text or "", re.M))
    return n or None


def smaller(a: int | None, b: int | None) -> int | None:
    """The smaller of two figures, either of which may be unknown."""
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


if __name__ == "__main__":
    sys.exit(_launch(sys.argv[1:]))
