"""A target's probe as stored (``targets.probe``, a session's snapshot): its pg_settings
rows to and from JSON, and the hardware the knob bounds are relative to."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from app.errors import RequestError
from optimizer.catalogue import Hardware
from optimizer.knobs import SettingRow


def rows_from_json(data: Mapping[str, Any]) -> dict[str, SettingRow]:
    rows = {}
    for name, r in data.items():
        fields = dict(r)
        if fields.get("enumvals") is not None:
            fields["enumvals"] = tuple(fields["enumvals"])
        rows[name] = SettingRow(**fields)
    return rows


def rows_to_json(rows: Mapping[str, SettingRow]) -> dict[str, Any]:
    return {name: dataclasses.asdict(row) for name, row in rows.items()}


def hardware_from(ram_bytes: int | None, cpus: int | None, max_connections: int = 100) -> Hardware:
    if not ram_bytes or not cpus:
        raise RequestError(
            "the target's RAM and CPU count are unknown (it is not on this host): "
            "register it with ram_bytes and cpus"
        )
    return Hardware(ram_bytes=ram_bytes, cpus=cpus, max_connections=max_connections)
