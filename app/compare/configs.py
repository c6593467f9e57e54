"""What each config of a comparison is on its server: the settings applied over its own.

* ``default``: PostgreSQL's default of every catalogue knob whose current value differs
  from it: its built-in value (``pg_settings.boot_val``), or initdb's (shared_buffers
  128MB); wal_buffers' built-in -1 ("auto") is written as the size PostgreSQL chooses
  for that shared_buffers (4MB), so that what took effect can be checked;
* ``current``: nothing: the server's settings as they are;
* ``pgtune``: PGTune's config (optimizer/heuristic.py) for the memory and CPUs the server
  really has (its cgroup's limits, or the target's declared RAM and CPUs), for the
  workload's kind; a value this server does not accept is left out, with a note;
* default and pgtune on a target that cannot be restarted leave out the knobs that need
  a restart (shared_buffers, ...), with a note, as a session skips them;
* ``session:N``: the knobs session N recommends changing (as ``knobtune apply`` would);
* a name of the user's own: its settings, checked against the catalogue and the server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.compare.schemas import ConfigIn, session_ref
from app.errors import RequestError
from app.postgres.units import same_value
from app.targets.probe_data import hardware_from
from optimizer.catalogue import CATALOGUE, MB, PAGE
from optimizer.compare import check_config
from optimizer.heuristic import db_type_for, pgtune
from optimizer.knobs import Config, Knob, KnobError, KnobValueError, SettingRow

# Read from the server besides the catalogue: pgtune's connections, wal_buffers' auto size.
EXTRA_SETTINGS = ("max_connections", "wal_segment_size")
# Defaults that are initdb's, not the compiled-in value: initdb writes shared_buffers =
# 128MB (the documented default) unless the kernel cannot take it; the compiled-in 1024
# pages (8MB) is not what anyone runs.
INITDB_DEFAULTS = {"shared_buffers": "128MB"}


@dataclass
class Resolved:
    """A config as it runs: its name, its kind and the settings applied over the server's."""

    name: str
    kind: str  # default, current, pgtune, session, settings
    settings: dict[str, str] | None  # None: computed when the comparison starts
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "settings": self.settings, "note": self.note}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Resolved:
        settings = d.get("settings")
        return cls(
            name=str(d["name"]),
            kind=str(d["kind"]),
            settings=None if settings is None else {str(k): str(v) for k, v in settings.items()},
            note=d.get("note"),
        )


def kind_of(entry: ConfigIn) -> str:
    if entry.name in ("default", "current", "pgtune"):
        return entry.name
    return "session" if session_ref(entry.name) is not None else "settings"


def _bytes(row: SettingRow | None, fallback: int) -> int:
    """A memory setting's value in bytes (``setting`` in its unit), or ``fallback``."""
    if row is None:
        return fallback
    try:
        unit = {"8kB": PAGE, "kB": 1024, "MB": MB, "B": 1}.get(row.unit or "B", 1)
        return int(float(row.setting)) * unit
    except ValueError:
        return fallback


def default_config(rows: Mapping[str, SettingRow]) -> Config:
    """PostgreSQL's defaults of the catalogue knobs the server sets otherwise: the built-in
    values (``boot_val``), initdb's where it writes one (INITDB_DEFAULTS)."""
    out: Config = {}
    for name in CATALOGUE:
        row = rows.get(name)
        boot = INITDB_DEFAULTS.get(name) or (row.boot_val if row is not None else None)
        if row is None or not boot:
            continue
        try:
            knob = Knob.from_row(row)
            value = knob.format(knob.parse(boot))
        except (KnobError, KnobValueError):
            continue
        if name == "wal_buffers" and knob.parse(boot) == -1:
            # -1: 1/32 of shared_buffers (its default), at least 8 pages and at most a WAL
            # segment (xlog.c XLOGChooseNumBuffers): written as a size, to be checked
            pool_pages = (128 * MB) // PAGE
            segment = _bytes(rows.get("wal_segment_size"), 16 * MB)
            pages = min(max(pool_pages // 32, 8), segment // PAGE)
            value = knob.format(float(pages))
        if not same_value(value, row.setting, row):
            out[name] = value
    return out


def pgtune_config(
    rows: Mapping[str, SettingRow],
    ram_bytes: int | None,
    cpus: int | None,
    kind: str,
    version_num: int,
) -> tuple[Config, str]:
    """PGTune's config for this server, and a note on what it was computed for."""
    try:
        connections = int(rows["max_connections"].setting) if "max_connections" in rows else 100
        hw = hardware_from(ram_bytes, cpus, max(connections, 1))
    except (KnobError, ValueError) as exc:
        raise RequestError(f"pgtune cannot be computed for this server: {exc}") from None
    db_type = db_type_for(kind)
    tuned = pgtune(hw, db_type, pg_version=max(10, version_num // 10000))
    kept: Config = {}
    dropped: list[str] = []
    for name, value in tuned.items():
        try:
            kept |= check_config({name: value}, rows, ram_bytes=ram_bytes, allow_unsafe=True)
        except KnobError as exc:
            dropped.append(f"{name} ({exc})")
    note = (
        f"PGTune's {db_type} config for {hw.ram_bytes / 2**30:.2f} GiB and {hw.cpus} CPU(s), "
        f"{hw.max_connections} connections"
    )
    if dropped:
        note += "; left out, this server does not accept: " + "; ".join(dropped)
    return kept, note


def restart_knobs(config: Mapping[str, str], rows: Mapping[str, SettingRow]) -> list[str]:
    """The knobs of ``config`` that need a restart to change from the server's values."""
    return [
        k
        for k, v in config.items()
        if (row := rows.get(k)) is not None
        and row.context == "postmaster"
        and not same_value(v, row.setting, row)
    ]


def check_inline(
    entry: ConfigIn, rows: Mapping[str, SettingRow], ram_bytes: int | None, allow_unsafe: bool
) -> Config:
    """An inline config's settings, checked; RequestError naming the config otherwise."""
    try:
        return check_config(
            entry.settings or {}, rows, ram_bytes=ram_bytes, allow_unsafe=allow_unsafe
        )
    except KnobError as exc:
        raise RequestError(f"config {entry.name!r}: {exc}") from None


def complete(
    configs: Sequence[Resolved],
    rows: Mapping[str, SettingRow],
    *,
    ram_bytes: int | None,
    cpus: int | None,
    kind: str,
    version_num: int,
    no_restart: str | None = None,
) -> list[Resolved]:
    """The configs with default, current and pgtune computed for the server as it is now
    (``rows``: its pg_settings; the hardware it really has).

    ``no_restart``: why the target cannot be restarted (None: it can). Then default and
    pgtune leave out the knobs that would need a restart, and their note says so, as a
    session skips them; a config of the user's own is refused instead (its values are
    what the user asked to measure).
    """
    out: list[Resolved] = []
    for c in configs:
        if c.kind == "default":
            settings = default_config(rows)
            note = "PostgreSQL's defaults of the knobs knobtune tunes" + (
                ", where this server's differ" if settings else ": this server has them all"
            )
        elif c.kind == "current":
            out.append(Resolved(c.name, c.kind, {}, "the server's settings as they are"))
            continue
        elif c.kind == "pgtune":
            settings, note = pgtune_config(rows, ram_bytes, cpus, kind, version_num)
        else:
            out.append(c)
            continue
        need = restart_knobs(settings, rows) if no_restart is not None else []
        if need:
            settings = {k: v for k, v in settings.items() if k not in need}
            note += (
                f"; left out: {', '.join(need)} (a restart is needed, and {no_restart}), "
                "so this is not the whole config"
            )
        out.append(Resolved(c.name, c.kind, settings, note))
    return out
