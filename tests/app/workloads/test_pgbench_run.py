"""A workload and a client sweep are both a pgbench run (PgbenchRunIn): one set of shared
fields and one statement of their rules, each body with its own defaults."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from app.sweeps.schemas import SweepIn
from app.workloads.schemas import PgbenchRunIn, WorkloadIn

# init too, which a workload words with its own default (none for your scripts only)
SHARED = ("builtin_weight", "scripts", "jobs", "protocol")


def _refusal(model: type[PgbenchRunIn], body: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as exc:
        model.model_validate(body)
    return str(exc.value)


@pytest.mark.parametrize("model", [WorkloadIn, SweepIn])
def test_both_bodies_state_the_runs_rules_in_the_same_words(model: type[PgbenchRunIn]) -> None:
    said = _refusal(model, {"duration_s": 4, "warmup_s": 4})
    assert "warmup_s (4) must be less than duration_s (4): warm-up seconds are dropped" in said
    said = _refusal(model, {"builtin": None})
    assert "give a builtin script or at least one SQL script" in said
    assert "script is empty" in _refusal(model, {"scripts": [{"sql": " "}]})


def test_the_shared_fields_are_one_schema_and_each_body_keeps_its_defaults() -> None:
    work, sweep = WorkloadIn.model_json_schema(), SweepIn.model_json_schema()
    for name in SHARED:
        assert work["properties"][name] == sweep["properties"][name], name
    assert (SweepIn().duration_s, SweepIn().warmup_s, SweepIn().scale) == (10, 2, 10)
    assert (WorkloadIn().duration_s, WorkloadIn().warmup_s) == (60, 5)
    assert sweep["properties"]["scale"]["type"] == "integer"
    assert sweep["properties"]["builtin"] != work["properties"]["builtin"]  # pgbench's only
