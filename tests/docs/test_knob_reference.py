"""docs/knobs.md is the catalogue's own reference: the committed page is what
app/docs_knobs.py renders from optimizer/catalogue.py now, and it names every knob.
Regenerate with `.venv/bin/python -m app.docs_knobs`."""

from __future__ import annotations

from app.docs_knobs import PAGE, knob_class, render
from optimizer.catalogue import CATALOGUE
from optimizer.checkpoints import CHECKPOINT_KNOBS
from tests.helpers import ROOT


def test_the_committed_page_is_the_generators_output() -> None:
    assert PAGE == ROOT / "docs" / "knobs.md"
    fix = "run .venv/bin/python -m app.docs_knobs"
    assert PAGE.read_text() == render(), f"docs/knobs.md differs from the catalogue: {fix}"


def test_every_knob_has_a_row_with_its_context_and_class() -> None:
    rows = {
        line.split("|")[1].strip().strip("`"): line
        for line in render().splitlines()
        if line.startswith("| `")
    }
    assert sorted(rows) == sorted(CATALOGUE)
    for name, spec in CATALOGUE.items():
        cells = [c.strip() for c in rows[name].split("|")[1:-1]]
        assert cells[2].startswith("reload") != (spec.context == "postmaster"), name
        assert cells[5] == knob_class(spec), name
    # the three classes as the session decides them
    assert knob_class(CATALOGUE["max_wal_size"]) == "checkpoint cycle"
    assert knob_class(CATALOGUE["shared_buffers"]) == "restart"
    assert knob_class(CATALOGUE["work_mem"]) == "at once"
    assert all(knob_class(CATALOGUE[k]) == "checkpoint cycle" for k in CHECKPOINT_KNOBS)
