"""Compare PostgreSQL setting values the way the server reads them.

'16MB', '16384kB' and a pg_settings row (setting='16384', unit='kB') are the same
work_mem; string equality says otherwise. ``normalize`` maps a value text to a
comparable form using the knob's vartype and base unit from ``pg_settings``.
"""

from __future__ import annotations

import math
import re

from optimizer.knobs import SettingRow

# Multipliers to bytes / microseconds: the units PostgreSQL accepts in values.
_MEMORY = {"B": 1, "kB": 1024, "MB": 1024**2, "GB": 1024**3, "TB": 1024**4}
_TIME = {
    "us": 1,
    "ms": 1000,
    "s": 1_000_000,
    "min": 60_000_000,
    "h": 3_600_000_000,
    "d": 86_400_000_000,
}

_NUMBER = re.compile(
    r"^\s*(?P<num>[-+]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?))"
    r"\s*(?P<unit>[A-Za-z]+)?\s*$"
)
_BASE_UNIT = re.compile(r"^(?P<mult>\d+)?\s*(?P<unit>[A-Za-z]+)$")

_TRUE = ("on", "true", "yes", "1")
_FALSE = ("off", "false", "no", "0")


class UnitError(ValueError):
    """The value cannot be read as this knob's type (PostgreSQL would reject it too)."""


def _unit_scale(unit: str) -> tuple[str, float]:
    """('memory' | 'time', multiplier to bytes or microseconds) of a unit such as '8kB'."""
    m = _BASE_UNIT.match(unit.strip())
    if not m:
        raise UnitError(f"unknown unit {unit!r}")
    mult = float(m.group("mult") or 1)
    name = m.group("unit")
    if name in _MEMORY:
        return "memory", mult * _MEMORY[name]
    if name in _TIME:
        return "time", mult * _TIME[name]
    raise UnitError(f"unknown unit {unit!r}")


def parse_bool(text: str) -> bool:
    """PostgreSQL's parse_bool: any unambiguous prefix of on/off/true/false/yes/no, or 1/0."""
    v = text.strip().strip("'").lower()
    if not v:
        raise UnitError("empty value for a boolean")
    if v in ("1", "0"):
        return v == "1"
    # 'o' alone is ambiguous (on/off): PostgreSQL needs at least 'on' or 'of'.
    for word in ("true", "yes", "on"):
        if word.startswith(v) and not (word == "on" and len(v) < 2):
            return True
    for word in ("false", "no", "off"):
        if word.startswith(v) and not (word == "off" and len(v) < 2):
            return False
    raise UnitError(f"{text!r} is not a boolean")


def to_base_units(text: str, row: SettingRow) -> float:
    """A numeric value in the knob's base unit (e.g. 8kB blocks for shared_buffers)."""
    m = _NUMBER.match(text.strip().strip("'"))
    if not m:
        raise UnitError(f"{text!r} is not a number for {row.name}")
    num_text = m.group("num")
    try:
        num = float(num_text)
    except ValueError:  # hexadecimal, which the server accepts for integers
        num = float(int(num_text, 16))
    unit = m.group("unit")
    if unit is not None:
        if not row.unit:
            raise UnitError(f"{row.name} takes no unit, got {text!r}")
        kind, base = _unit_scale(row.unit)
        table = _MEMORY if kind == "memory" else _TIME
        if unit not in table:
            raise UnitError(f"unit {unit!r} does not fit {row.name} (unit {row.unit})")
        num = num * table[unit] / base
    if not math.isfinite(num):
        raise UnitError(f"{text!r} is not a finite number")
    if row.vartype == "integer":
        # The server rounds to the nearest base unit (rint: half to even, like round()).
        num = float(round(num))
    return num


def normalize(text: str, row: SettingRow) -> str | float:
    """A comparable form of ``text`` as a value of ``row``'s knob.

    Numbers become floats in the base unit, booleans 'on'/'off', enums lower case;
    strings are returned stripped. Raises UnitError for values of the wrong type.
    """
    if row.vartype == "bool":
        return "on" if parse_bool(text) else "off"
    if row.vartype in ("integer", "real"):
        return to_base_units(text, row)
    if row.vartype == "enum":
        return text.strip().strip("'").lower()
    return text.strip()


def same_value(a: str, b: str, row: SettingRow) -> bool:
    """Whether two value texts mean the same setting of ``row``'s knob."""
    try:
        na, nb = normalize(a, row), normalize(b, row)
    except UnitError:
        return a.strip() == b.strip()
    if isinstance(na, float) and isinstance(nb, float):
        # pg_settings prints reals with %g (6 significant digits).
        return math.isclose(na, nb, rel_tol=1e-5, abs_tol=1e-12)
    return na == nb
