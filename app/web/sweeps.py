"""Client sweeps (issue 16): a sweep's page, starting one from the target list, cancelling."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app.api.deps import DB, Sched
from app.db import Database
from app.reports.chart import render_sweep_svg
from app.sweeps import service as sweep_svc
from app.sweeps.schemas import SweepIn
from app.targets import service as target_svc
from app.web.render import page_routers, render_page, shown_on

page, post = page_routers()


def _sweep_page(
    request: Request, db: Database, sweep_id: int, error: str | None = None, status: int = 200
) -> HTMLResponse:
    sw = sweep_svc.get_sweep(db, sweep_id)
    target = target_svc.get_target(db, sw.target_id)
    out = sweep_svc.sweep_out(sw)
    chart = render_sweep_svg(
        out.points, knee=out.knee_clients, title=f"Client sweep {sw.id}: tps and p99 vs clients"
    )
    ctx = {"w": out, "target": target, "chart": chart, "error": error}
    return render_page(request, "sweep.html", ctx, status)


@page.get("/sweeps/{sweep_id}", response_class=HTMLResponse)
def sweep_page(sweep_id: int, request: Request, db: DB) -> HTMLResponse:
    return _sweep_page(request, db, sweep_id)


@post.post("/targets/{target_id}/sweeps")
def start_sweep(target_id: int, request: Request, db: DB, sched: Sched) -> Response:
    """A sweep with the defaults (tpcb-like, 1, 2, 4, ... to the cap, 10 s runs twice)."""
    sw = sweep_svc.create_sweep(db, target_id, SweepIn())
    if sched is not None:
        sched.wake()  # the scheduler claims it now, not at its next poll
    return RedirectResponse(f"/sweeps/{sw.id}", status_code=303)


@post.post("/sweeps/{sweep_id}/cancel")
def cancel_sweep(sweep_id: int, request: Request, db: DB) -> Response:
    with shown_on(
        lambda message, status: _sweep_page(request, db, sweep_id, error=message, status=status)
    ):
        sweep_svc.cancel_sweep(db, sweep_id)
    return RedirectResponse(f"/sweeps/{sweep_id}", status_code=303)
