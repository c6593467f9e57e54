"""A setting's value as a DBA would write it (app/postgres/units.py; shown on charts and
in summaries)."""

from __future__ import annotations

from app.postgres.units import readable


def test_values_in_the_units_a_dba_writes() -> None:
    assert readable("6170912kB") == "5.89GB"
    assert readable("28569kB") == "27.9MB"
    assert readable("6GB") == "6GB"
    assert readable("4096kB") == "4MB"
    assert readable("on") == "on"
    assert readable("200") == "200"
