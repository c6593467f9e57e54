"""Compare PostgreSQL setting values the way the server reads them.

'16MB', '16384kB' and a pg_settings row (setting='16384', unit='kB') are the same
work_mem; string equality says otherwise. The parsing itself is the optimizer's
(one parser for the whole project); this module only adapts it to pg_settings rows.
"""

from __future__ import annotations

import math

from optimizer.knobs import Knob, KnobError, KnobValueError, SettingRow


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
