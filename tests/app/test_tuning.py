"""How a stored request becomes an optimizer: hints, start config, descriptions."""

from __future__ import annotations

from app.schemas import SessionIn
from app.tuning import build_space, describe, hints_for, make_optimizer, start_config
from optimizer.catalogue import Hardware
from optimizer.descent import Measurement
from optimizer.heuristic import pgtune

HW = Hardware(ram_bytes=24 * 2**30, cpus=2)
KNOBS = ["work_mem", "shared_buffers", "random_page_cost"]


def session(**kw: object) -> SessionIn:
    return SessionIn.model_validate({"target_id": 1, "knobs": KNOBS, **kw})


def test_hints_are_the_pgtune_values_of_the_tuned_knobs() -> None:
    body = session()  # the default workload, TPC-B, is write-heavy: PGTune's oltp
    space = build_space(body, {}, HW)
    hints = hints_for(body, space, HW)
    expected = pgtune(HW, "oltp")
    assert hints == {k: expected[k] for k in KNOBS}
    assert hints["work_mem"] != pgtune(HW, "mixed")["work_mem"]  # oltp: twice mixed's


def test_start_config_takes_pgtune_of_the_workload_kind() -> None:
    body = session(start="heuristic", workload_kind="read-heavy")
    space = build_space(body, {}, HW)
    start = start_config(body, space, {}, HW)
    web = pgtune(HW, "web")
    assert start["work_mem"] == web["work_mem"]


def test_no_hints_when_asked_or_when_starting_from_the_heuristic() -> None:
    for body in (session(hints=False), session(start="heuristic")):
        assert hints_for(body, build_space(body, {}, HW), HW) is None


def test_the_first_candidate_after_the_baseline_tries_the_hints_together() -> None:
    body = session(seed=1)
    space = build_space(body, {}, HW)
    start = start_config(body, space, {}, HW)
    opt = make_optimizer(body, space, start, 1, hints_for(body, space, HW))
    samples = Measurement(samples=tuple([100.0] * 10))
    cand = opt.suggest()
    while cand is not None and cand.role == "baseline":
        opt.register(cand, samples)
        cand = opt.suggest()
    assert cand is not None
    assert cand.knob is None  # several knobs at once
    assert describe(cand).startswith("measuring hints: ")
    hints = hints_for(body, space, HW)
    assert hints is not None
    for name in KNOBS:
        assert space[KNOBS.index(name)].parse(cand.config[name]) == space[KNOBS.index(name)].parse(
            hints[name]
        )
