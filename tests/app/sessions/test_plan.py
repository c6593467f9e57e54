"""How a stored request becomes an optimizer: hints, start config, descriptions."""

from __future__ import annotations

from app.sessions.plan import (
    build_space,
    descent_settings,
    describe,
    hints_for,
    make_optimizer,
    outside_bounds_notes,
    start_config,
)
from app.sessions.schemas import SessionIn
from optimizer.catalogue import Hardware
from optimizer.descent import Measurement
from optimizer.heuristic import pgtune
from optimizer.knobs import SettingRow

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


def test_user_bounds_that_leave_out_the_servers_value_keep_it_as_the_start_with_a_note() -> None:
    row = SettingRow("work_mem", "4096", "kB", "integer", "user", "64", "2147483647")
    body = session(knobs=[{"name": "work_mem", "min": "16MB", "max": "32MB"}])
    space = build_space(body, {"work_mem": row}, HW)
    (wm,) = space
    assert wm.format(wm.lower) == "4MB"
    assert wm.format(wm.upper) == "32MB"
    assert start_config(body, space, {"work_mem": "4MB"}, HW)["work_mem"] == "4MB"
    (note,) = outside_bounds_notes(body, {"work_mem": row}, space)
    assert "work_mem: the server's value 4MB lies outside the requested 16MB..32MB" in note


def test_a_heuristic_start_says_which_of_the_servers_values_it_replaces() -> None:
    from app.sessions.plan import session_optimizer
    from app.targets.probe_data import rows_to_json

    body = session(start="heuristic", knobs=["work_mem"])
    row = SettingRow("work_mem", "4096", "kB", "integer", "user", "64", "2147483647")
    stored = {
        "rows": rows_to_json({"work_mem": row}),
        "hardware": {"ram_bytes": HW.ram_bytes, "cpus": HW.cpus},
        "target": {"effective": {"work_mem": "4MB"}},
    }
    built = session_optimizer(body, stored, 1, can_restart=True)
    (note,) = [n for n in built.notes if n.startswith("start: heuristic")]
    assert f"work_mem 4MB -> {built.start['work_mem']}" in note


def test_the_search_order_and_the_checkpoint_rule_reach_the_descent() -> None:
    # the defaults: issue 29's search (the counters' order, the checkpoint rule)
    s = descent_settings(session(), 1)
    assert s.order_by_counters
    assert s.checkpoint_rule
    # the search as before it, for a before/after (bench/e2e.py --as-before)
    s = descent_settings(session(search_order="catalogue", checkpoint_rule=False), 1)
    assert not s.order_by_counters
    assert not s.checkpoint_rule


ROWS = {
    "work_mem": SettingRow("work_mem", "4096", "kB", "integer", "user", "64", "2147483647"),
    "random_page_cost": SettingRow("random_page_cost", "4", None, "real", "user", "0", "1e+300"),
    "effective_cache_size": SettingRow(
        "effective_cache_size", "524288", "8kB", "integer", "user", "1", "2147483647"
    ),
    "shared_buffers": SettingRow(
        "shared_buffers", "16384", "8kB", "integer", "postmaster", "16", "1073741823"
    ),
}
OWN = {
    "work_mem": "4MB",
    "random_page_cost": "4",
    "effective_cache_size": "4GB",
    "shared_buffers": "128MB",
}


def _stored() -> dict[str, object]:
    from app.targets.probe_data import rows_to_json

    return {
        "rows": rows_to_json(ROWS),
        "hardware": {"ram_bytes": HW.ram_bytes, "cpus": HW.cpus},
        "target": {"effective": OWN},
    }


def test_a_heuristic_start_holds_the_rest_of_pgtunes_config_in_every_run() -> None:
    """start: heuristic runs PGTune's whole config, not its values for the tuned knobs
    only: the rest is applied with the start and held, so the claim is over PGTune."""
    from app.sessions.plan import HELD, session_optimizer

    body = session(start="heuristic", knobs=["work_mem"])
    built = session_optimizer(body, _stored(), 1, can_restart=True)
    tuned = pgtune(HW, "oltp")
    # the server's settings PGTune sets, but the session does not tune (rows it lacks: left)
    assert set(built.held) == {"random_page_cost", "effective_cache_size", "shared_buffers"}
    for name in built.held:
        assert built.optimizer.excluded[name] == HELD
        assert built.start[name] == tuned[name]
    cand = built.optimizer.suggest()
    assert cand is not None
    assert cand.role == "baseline"
    assert cand.config["random_page_cost"] == "1.1"
    assert [n for n in built.notes if "held at its values" in n]
    # one knob is tuned; the plan says so
    from app.sessions.runner import plan_text

    assert plan_text(built.optimizer, built.held).startswith("plan: 1 knob(s)")
    # a knob that needs a restart the target cannot do stays as the server has it
    no_restart = session_optimizer(body, _stored(), 1, can_restart=False)
    assert "shared_buffers" not in no_restart.held
    assert "shared_buffers" not in no_restart.start
    # starting from the server's own values holds nothing
    assert session_optimizer(session(knobs=["work_mem"]), _stored(), 1, can_restart=True).held == ()


def test_a_heuristic_sessions_recommendation_is_its_whole_best_config_against_the_server() -> None:
    """apply, compare and the export change what the session measured: PGTune's held
    values as well as what the walk kept, each from the server's own value."""
    from app.models import TuningSession
    from app.sessions.apply import recommended_changes
    from app.targets.probe_data import rows_to_json

    snapshot = {"rows": rows_to_json(ROWS), "target": {"effective": OWN}}
    start = {"work_mem": "21MB", "random_page_cost": "1.1", "effective_cache_size": "18GB"}
    best = {**start, "work_mem": "64MB"}
    sess = TuningSession(
        request={"start": "heuristic"},
        snapshot=snapshot,
        start_config=start,
        best_config={**best, "shared_buffers": "131072kB"},  # the server's 128MB, other text
        gain_status="confirmed",
    )
    assert recommended_changes(sess) == best
    sess.request = {"start": "current"}  # from the server's own: what the walk changed
    assert recommended_changes(sess) == {"work_mem": "64MB", "shared_buffers": "131072kB"}
    sess.request, sess.gain_status = {"start": "heuristic"}, "no-change"
    assert recommended_changes(sess) == {}
