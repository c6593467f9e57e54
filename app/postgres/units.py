"""Compare PostgreSQL setting values the way the server reads them.

'16MB', '16384kB' and a pg_settings row (setting='16384', unit='kB') are the same
work_mem; string equality says otherwise. The parsing itself is the optimizer's
(one parser for the whole project); this module only adapts it to pg_settings rows.
:func:`readable` writes a memory value as a DBA would, for display (charts, summaries).
"""

from __future__ import annotations

import math
import re

from optimizer.knobs import Knob, KnobError, KnobValueError, SettingRow

_MEMORY = re.compile(r"^(\d+)(kB|MB|GB|TB)$")
_UNITS = (("TB", 1024**3), ("GB", 1024**2), ("MB", 1024), ("kB", 1))


def same_value(a: str, b: str, row: SettingRow) -> bool:
    """Whether two value texts mean the same setting of ``row``'s knob."""
    try:
        knob = Knob.from_row(row)
        na, nb = knob.parse(a), knob.parse(b)
    except (KnobError, KnobValueError):
        if row.vartype == "enum":  # PostgreSQL matches enum names case-insensitively
            return a.strip().lower() == b.strip().lower()
        return a.strip() == b.strip()
    if isinstance(na, float) and isinstance(nb, float):
        # pg_settings prints reals with %g (6 significant digits).
        return math.isclose(na, nb, rel_tol=1e-6, abs_tol=1e-12)
    return na == nb


def readable(value: str) -> str:
    """A memory value in the unit a DBA would write: '6170912kB' -> '5.89GB' (display only)."""
    m = _MEMORY.match(value)
    if m is None:
        return value
    kb = int(m.group(1)) * dict(_UNITS)[m.group(2)]
    for unit, size in _UNITS:
        if kb >= size:
            n = kb / size
            return f"{n:.0f}{unit}" if n == int(n) or n >= 100 else f"{n:.3g}{unit}"
    return value
