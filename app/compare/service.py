"""Comparisons as a user sees them: create (one holder per target), get, list, cancel; the
table of levels and gains.

A comparison is run, kept alive, resumed and its target restored by the scheduler
(app/compare/runner.py), like a session. What is checked here, before anything is stored
or changed, is everything the request can get wrong: the configs' names, a session's
recommendation, inline settings against the catalogue and the server's own limits, a
config that needs a restart on a target that has no restart method, the workload.
"""

from __future__ import annotations

import secrets
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from app.compare.configs import Resolved, check_inline, kind_of, restart_knobs
from app.compare.rounds import levels_by_config
from app.compare.schemas import ComparisonIn, ComparisonOut, ConfigIn, session_ref
from app.db import Database, utcnow
from app.errors import RequestError, ServiceError, to_id
from app.lease import request_cancel
from app.models import Comparison, Target, TuningSession
from app.preflight import PreflightError, check_workload
from app.sessions.apply import recommended_changes
from app.sessions.summary import headline
from app.settings import Settings
from app.targets.access import restart_for
from app.targets.holds import server_holder
from app.targets.probe_data import rows_from_json
from app.targets.recommend import refuse_if_recommend_only
from app.targets.service import ensure_server_id
from app.workloads import workload_for
from app.workloads.base import WorkloadError
from optimizer.compare import ALPHA, check_config, paired_gain, round_orders, summarize
from optimizer.knobs import KnobError, SettingRow
from optimizer.objective import lower_is_better, objective_kind, unit


def _session_config(
    db: Database, entry: ConfigIn, rows: dict[str, SettingRow], body: ComparisonIn, ram: int | None
) -> Resolved:
    """session:N: the knobs session N recommends changing (as ``knobtune apply`` would)."""
    n = session_ref(entry.name)
    assert n is not None
    with db.session() as s:
        sess = s.get(TuningSession, to_id(n))
    if sess is None:
        raise ServiceError(422, f"config {entry.name!r}: no session {n}", fix="list-sessions")
    if sess.status != "succeeded":
        raise ServiceError(
            422,
            f"config {entry.name!r}: session {n} is {sess.status}, so it has no "
            "recommendation; compare a session that succeeded",
        )
    changes = recommended_changes(sess)
    try:
        settings = check_config(changes, rows, ram_bytes=ram, allow_unsafe=body.allow_unsafe)
    except KnobError as exc:
        raise ServiceError(422, f"config {entry.name!r}: {exc}") from None
    if not changes:
        note = f"session {n} recommends no change: the server's settings as they are"
    else:
        note = f"session {n}'s recommendation" + (
            f" ({sess.gain_status} {sess.gain:+.1%})" if sess.gain is not None else ""
        )
        if sess.target_id != body.target_id:
            note += f", tuned on target {sess.target_id}"
    return Resolved(entry.name, "session", settings, note)


def resolve_request(
    db: Database, settings: Settings, target: Target, body: ComparisonIn
) -> list[Resolved]:
    """The configs as far as they are known before the comparison starts (default and
    pgtune are computed for the server when it starts); ServiceError(422) for what the
    request got wrong."""
    rows = rows_from_json((target.probe or {}).get("rows", {}))
    out: list[Resolved] = []
    for entry in body.configs:
        kind = kind_of(entry)
        if kind == "session":
            out.append(_session_config(db, entry, rows, body, target.ram_bytes))
        elif kind == "settings":
            try:
                checked = check_inline(entry, rows, target.ram_bytes, body.allow_unsafe)
            except RequestError as exc:
                raise ServiceError(422, str(exc)) from None
            out.append(Resolved(entry.name, kind, checked, None))
        else:
            out.append(Resolved(entry.name, kind, None))
    method, reason = restart_for(target, settings)
    if method is None:
        for c in out:
            need = restart_knobs(c.settings or {}, rows)
            if need:
                raise ServiceError(
                    422,
                    f"config {c.name!r} changes {', '.join(need)}, which need(s) a server "
                    f"restart, and {reason}; give the target a restart method, or leave "
                    "those knobs out",
                )
    return out


def create_comparison(db: Database, settings: Settings, body: ComparisonIn) -> Comparison:
    with db.session() as s:
        target = s.get(Target, to_id(body.target_id))
    if target is None:
        raise ServiceError(
            422,
            f"unknown target_id {body.target_id}: register the server first",
            fix="list-targets",
        )
    refuse_if_recommend_only(target, "run a comparison (it applies each config)")
    if target.retired_at is not None:
        raise ServiceError(
            422, f"target {target.id} is retired (kept for its history); register the server again"
        )
    configs = resolve_request(db, settings, target, body)
    try:
        workload_for(body.workload).streams()
    except WorkloadError as exc:
        raise ServiceError(422, str(exc)) from None
    ensure_server_id(db, target)  # targets registered before server identities were kept
    with db.session() as s:
        held = server_holder(s, target)  # the server, through whichever target row
        if held is not None:
            raise ServiceError(409, f"{held}; wait or cancel it")
        others = list(s.scalars(select(Target.dsn).where(Target.id != target.id)))
    try:
        # a script that cannot run is a 422 now, not a comparison failing later
        check_workload(target.workload_dsn, body.workload, known_dsns=others)
    except PreflightError as exc:
        raise ServiceError(422, str(exc)) from exc
    row = Comparison(
        target_id=target.id,
        status="queued",
        phase="queued",
        request=body.model_dump(mode="json"),
        seed=body.seed if body.seed is not None else secrets.randbelow(2**31),
        configs=[c.to_json() for c in configs],
        runs=[],
        notes=[],
        cancel_requested=False,
        attempts=0,
        created_at=utcnow(),
    )
    try:
        with db.session() as s:
            s.add(row)
    except IntegrityError as exc:  # the partial unique index lost a race
        raise ServiceError(
            409, f"target {target.id} just got another comparison; retry later"
        ) from exc
    return row


def get_comparison(db: Database, comparison_id: int) -> Comparison:
    with db.session() as s:
        row = s.get(Comparison, to_id(comparison_id))
        if row is None:
            raise ServiceError(404, f"no comparison {comparison_id}", fix="list-comparisons")
        return row


def list_comparisons(
    db: Database, target_id: int | None = None, limit: int = 100
) -> list[Comparison]:
    with db.session() as s:
        q = select(Comparison).order_by(Comparison.id.desc()).limit(limit)
        if target_id is not None:
            q = q.where(Comparison.target_id == to_id(target_id))
        return list(s.scalars(q).all())


def cancel_comparison(db: Database, comparison_id: int) -> Comparison:
    with db.session() as s:
        stopping = "cancelling: the run stops and the target's settings are restored"
        outcome = request_cancel(s, Comparison, to_id(comparison_id), stopping)
        row = s.get(Comparison, to_id(comparison_id))
        if row is None:
            raise ServiceError(404, f"no comparison {comparison_id}", fix="list-comparisons")
        if outcome is None:
            raise ServiceError(409, f"comparison {comparison_id} is already {row.status}")
        return row


# -- the table ---------------------------------------------------------------------------
def names_of(row: Comparison) -> list[str]:
    return [str(c["name"]) for c in row.request.get("configs", [])]


def reference_of(row: Comparison) -> str:
    return str(row.request.get("reference") or names_of(row)[0])


def orders_of(row: Comparison) -> list[list[str]]:
    """Per round, the configs in the order they run (from the recorded seed)."""
    names = names_of(row)
    rounds = int(row.request.get("rounds", 0))
    return [[names[i] for i in order] for order in round_orders(len(names), rounds, row.seed)]


def gain_sentence(objective: str, g: dict[str, Any]) -> str:
    """ "throughput +5.3% (95% CI +1.2% to +9.6%), p=0.012", "...: not significant"."""
    if g["gain"] is None:
        return "not measured: no round in which both ran completely"
    text = headline(objective, g["gain"], g["ci95"]) or ""
    p = g["p_value"]
    if p is None:
        return text + (", one round only" if g["rounds"] < 2 else ", no spread between rounds")
    text += f", p={p:.2g}"
    return text if p < ALPHA else text + ": not significant"


def figures(row: Comparison) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per config its median level and 95% interval; per config but the reference its
    gain over the reference from the rounds' paired ratios."""
    names, ref = names_of(row), reference_of(row)
    objective = objective_kind(row.request)
    lower = lower_is_better(objective)
    levels = levels_by_config(row.runs or [], names, int(row.request.get("rounds", 0)))
    summary = summarize(levels, lower)
    table = [{"name": n, **summary[n]} for n in names]
    gains = []
    for n in names:
        if n == ref:
            continue
        est = paired_gain(levels[n], levels[ref], lower)
        g = {"name": n, "vs": ref, **est.to_json(), "significant": est.significant}
        g["text"] = gain_sentence(objective, g)
        gains.append(g)
    return table, gains


def comparison_out(row: Comparison, target_name: str | None = None) -> ComparisonOut:
    names = names_of(row)
    objective = objective_kind(row.request)
    table, gains = figures(row)
    elapsed = None
    if row.started_at is not None:
        elapsed = round(((row.finished_at or utcnow()) - row.started_at).total_seconds(), 1)
    configs = list(row.configs or [])
    return ComparisonOut(
        id=row.id,
        target_id=row.target_id,
        target_name=target_name,
        status=row.status,
        phase=row.phase,
        request=row.request,
        seed=row.seed,
        reference=reference_of(row),
        objective=objective,
        unit=unit(objective),
        configs=configs,
        orders=orders_of(row),
        runs_done=len(row.runs or []),
        runs_planned=len(names) * int(row.request.get("rounds", 0)),
        elapsed_s=elapsed,
        runs=list(row.runs or []),
        levels=table,
        gains=gains,
        notes=[str(n) for n in row.notes or []],
        restored=row.restored,
        error=row.error,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
    )


def target_names(db: Database) -> dict[int, str]:
    with db.session() as s:
        return {int(i): str(n) for i, n in s.execute(select(Target.id, Target.name)).all()}
