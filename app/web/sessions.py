"""Tuning sessions: starting one from the home page's form, one session's page (live
view, results) and cancelling it; applying its recommendation and rolling it back
(issue 27)."""

from __future__ import annotations

import re
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app.api.deps import DB
from app.db import Database
from app.models import ACTIVE_STATUSES
from app.reports.chart import final_label, points_of, render_svg
from app.sessions import apply as apply_svc
from app.sessions import service as session_svc
from app.sessions.schemas import ApplyIn, ApplyOut, RollbackIn, SessionIn
from app.sessions.summary import headline, note_kind
from app.sessions.verdicts import moved_verdicts
from app.targets import service as target_svc
from app.web.index import index_page
from app.web.render import HEADERS, Form, RenderedPages, page_routers, render_page, shown_on
from optimizer.objective import chart_axis, in_units, lower_is_better, objective_kind

page, post = page_routers()


# -- starting one: the home page's form ------------------------------------------------------
def _session_request(form: dict[str, str]) -> dict[str, Any]:
    """The form's fields as a SessionIn body; blank fields take the API's defaults."""

    def given(key: str) -> str | None:
        value = form.get(key, "").strip()
        return value or None

    workload: dict[str, Any] = {}
    builtin = given("builtin")  # blank: tpcb-like, or only the script when there is one
    if builtin is not None:
        workload["builtin"] = None if builtin == "none" else builtin
    if script := given("script"):
        workload["scripts"] = [{"sql": script}]
    for key in ("scale", "clients", "jobs", "duration_s", "warmup_s", "mode", "isolation"):
        if (value := given(key)) is not None:
            workload[key] = value
    body: dict[str, Any] = {"workload": workload}
    for key in ("target_id", "max_trials", "final_check_runs", "on_finish", "start", "objective"):
        if (value := given(key)) is not None:
            body[key] = value
    knobs = [k for k in re.split(r"[\s,]+", form.get("knobs", "")) if k]
    if knobs:
        body["knobs"] = knobs
    body["allow_unsafe"] = form.get("allow_unsafe") == "on"
    return body


@post.post("/sessions")
def start_session(request: Request, db: DB, form: Form) -> Response:
    with shown_on(
        lambda message, status: index_page(
            request, db, session_form=form, session_error=message, status=status
        ),
        form=True,
    ):
        sess = session_svc.create_session(db, SessionIn.model_validate(_session_request(form)))
    return RedirectResponse(f"/sessions/{sess.id}", status_code=303)


# -- one session ------------------------------------------------------------------------
def _session_ctx(db: Database, session_id: int) -> dict[str, Any]:
    sess = session_svc.get_session(db, session_id)
    trials = session_svc.trial_rows(db, session_id)
    # Trial count and mean trial time from the rows at hand: no extra count query.
    per_trial = (
        (trials[-1]["finished_at"] - trials[0]["started_at"]).total_seconds() / len(trials)
        if trials
        else None
    )
    target = target_svc.get_target(db, sess.target_id)
    out = session_svc.session_out(
        db, sess, {session_id: (len(trials), per_trial)}, name=target.name
    )
    objective = objective_kind(sess.request)
    axis, unit = chart_axis(objective)
    if unit != "tps":
        levels = session_svc.trial_levels(db, session_id, sess.request)
        for t in trials:
            t["level"] = levels.get(t["index"])
    chart = (
        render_svg(
            points_of(trials, unit=unit),
            baseline=out.baseline_tps if unit == "tps" else None,
            title=f"Session {session_id}: {axis.split(' (')[0]}",
            final_label=final_label(
                {"gain": out.gain, "gain_status": out.gain_status, "request": sess.request}
            ),
            axis=axis,
            unit=unit,
        )
        if any(t["median_tps"] is not None and t["error"] is None for t in trials)
        else None
    )
    start, best = sess.start_config or {}, sess.best_config or {}
    config = [
        {"knob": k, "start": start.get(k), "best": best.get(k), "changed": start.get(k) != best[k]}
        for k in sorted(best)
    ]
    applies = apply_svc.list_applies(db, session_id, sess=sess, target=target)
    return {
        "s": out,
        "target": {
            "id": target.id,
            "name": target.name,
            "dsn": target_svc.shown_dsn(target.dsn),
            "retired": target.retired_at is not None,
        },
        "trials": verdict_rows(trials, objective),
        "lower_is_better": lower_is_better(objective),
        "chart": chart,
        "config": config,
        # a failed session offers no download of a config that recommends nothing
        "downloads": sess.start_config is not None
        and sess.best_config is not None
        and (sess.status != "failed" or any(c["changed"] for c in config)),
        "wl": out.request.get("workload", {}),
        "knobs": _knobs_label(out.request.get("knobs")),
        # one figure in the objective's units; green when confirmed better, whatever its sign
        "result": "no change"
        if out.gain_status in apply_svc.NOTHING
        else headline(objective, out.gain),
        "result_ci": ""
        if out.gain_status in apply_svc.NOTHING
        else (headline(objective, out.gain, out.gain_ci) or "").partition(" (")[2][:-1],
        "good": out.gain_status == "confirmed" and (out.gain or 0) > 0,
        "bad": out.gain_status == "confirmed" and (out.gain or 0) < 0,
        "notes": [n for n in out.notes if note_kind(str(n)) == "note"],
        "warnings": [n for n in out.notes if note_kind(str(n)) == "warning"],
        "applies": applies,
        "can_apply": sess.status not in ACTIVE_STATUSES
        and target.retired_at is None
        and bool(apply_svc.recommended_changes(sess)),
        "can_rollback": any(a.status == "applied" for a in applies),
    }


def verdict_rows(trials: list[dict[str, Any]], objective: str) -> list[dict[str, Any]]:
    """The trial table's rows with each verdict on the candidate it judged.

    A keep or revert decided on an incumbent re-run (C I I: it lands on the last I) is
    shown on the candidate's row with its gain and p; the re-run says which trial it
    decided. Gains read in the objective's units (a query time that fell: -20%).
    """
    rows = [
        {
            **t,
            "shown_verdict": t["verdict"],
            "shown_gain": t["gain"],
            "shown_p": t["p_value"],
            "decided": None,
        }
        for t in trials
    ]
    by_index = {row["index"]: row for row in rows}
    moved = moved_verdicts((t["index"], t["role"], t["verdict"]) for t in trials)
    for index, shown in moved.items():
        row, last = by_index[index], by_index[shown]
        last.update(shown_verdict=row["verdict"], shown_gain=row["gain"], shown_p=row["p_value"])
        row.update(shown_verdict=None, shown_gain=None, shown_p=None, decided=shown)
    for row in rows:
        if row["shown_gain"] is not None:
            row["shown_gain"] = in_units(objective, row["shown_gain"])
    return rows


def _knobs_label(knobs: list[Any] | None) -> str:
    if not knobs:
        return "the catalogue's set for the workload"
    names = []
    for k in knobs:
        if isinstance(k, dict):
            lo, hi = k.get("min") or "", k.get("max") or ""
            names.append(f"{k.get('name')} [{lo}..{hi}]" if lo or hi else str(k.get("name")))
        else:
            names.append(str(k))
    return ", ".join(names)


def _session_page(
    request: Request,
    db: Database,
    session_id: int,
    *,
    error: str | None = None,
    status: int = 200,
) -> HTMLResponse:
    ctx = _session_ctx(db, session_id)
    return render_page(request, "session.html", {**ctx, "error": error}, status)


@page.get("/sessions/{session_id}", response_class=HTMLResponse)
def session_view(session_id: int, request: Request, db: DB) -> HTMLResponse:
    pages: RenderedPages = request.app.state.pages
    body = pages.get(session_id)
    if body is not None:
        return HTMLResponse(body, headers=HEADERS)
    response = _session_page(request, db, session_id)
    if response.status_code == 200:
        pages.put(session_id, bytes(response.body))
    return response


@page.get("/sessions/{session_id}/results", response_class=HTMLResponse)
def session_results(session_id: int, request: Request, db: DB) -> HTMLResponse:
    """The chart, config and trial table: the live view swaps it in when a trial completes."""
    return render_page(request, "_results.html", _session_ctx(db, session_id))


@post.post("/sessions/{session_id}/cancel")
def cancel(session_id: int, request: Request, db: DB) -> Response:
    with shown_on(
        lambda message, status: _session_page(request, db, session_id, error=message, status=status)
    ):
        session_svc.cancel_session(db, session_id)
    request.app.state.pages.forget(session_id)  # the redirect shows 'cancelling' at once
    return RedirectResponse(f"/sessions/{session_id}", status_code=303)


# -- apply a recommendation, roll it back (issue 27) -------------------------------------
def _apply_page(
    request: Request,
    db: Database,
    session_id: int,
    *,
    step: str,
    res: ApplyOut | None = None,
    error: str | None = None,
    status: int = 200,
) -> HTMLResponse:
    sess = session_svc.session_out(db, session_svc.get_session(db, session_id), detail=False)
    ctx = {"s": sess, "res": res, "step": step, "error": error}
    return render_page(request, "apply.html", ctx, status)


def _apply_step(
    request: Request, db: Database, session_id: int, body: ApplyIn | RollbackIn
) -> HTMLResponse:
    """Apply or roll back, as ``body`` says (a dry run: the review before the button):
    the result's page, or the step's page again with the service's refusal."""
    settings = request.app.state.settings
    step = "apply" if isinstance(body, ApplyIn) else "rollback"
    with shown_on(
        lambda message, status: _apply_page(
            request, db, session_id, step=step, error=message, status=status
        )
    ):
        if isinstance(body, ApplyIn):
            res = apply_svc.apply_session(db, settings, session_id, body)
        else:
            res = apply_svc.rollback_session(db, settings, session_id, body)
    if body.dry_run:
        return _apply_page(request, db, session_id, step=step, res=res)
    request.app.state.pages.forget(session_id)  # its page lists the applies: not stale
    return _apply_page(request, db, session_id, step="done", res=res)


@page.get("/sessions/{session_id}/apply", response_class=HTMLResponse)
def apply_review(session_id: int, request: Request, db: DB) -> HTMLResponse:
    """What applying would change on the server (a dry run), and the button to do it."""
    return _apply_step(request, db, session_id, ApplyIn(dry_run=True))


@post.post("/sessions/{session_id}/apply")
def apply_now(session_id: int, request: Request, db: DB, form: Form) -> Response:
    body = ApplyIn(force=form.get("force") == "on", restart=form.get("restart") == "on")
    return _apply_step(request, db, session_id, body)


@page.get("/sessions/{session_id}/rollback", response_class=HTMLResponse)
def rollback_review(session_id: int, request: Request, db: DB) -> HTMLResponse:
    return _apply_step(request, db, session_id, RollbackIn(dry_run=True))


@post.post("/sessions/{session_id}/rollback")
def rollback_now(session_id: int, request: Request, db: DB, form: Form) -> Response:
    return _apply_step(request, db, session_id, RollbackIn(confirm=form.get("confirm") == "on"))
