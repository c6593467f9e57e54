"""/api/v1/sweeps: client sweeps (issue 16), run by the scheduler like sessions."""

from __future__ import annotations

from fastapi import Query, Response

from app.api.deps import DB, Sched, api_router
from app.reports.chart import render_sweep_svg
from app.sweeps import service as sweeps
from app.sweeps.schemas import SweepIn, SweepOut

router = api_router("sweeps")


@router.post("/targets/{target_id}/sweeps", status_code=202, response_model=SweepOut)
def create_sweep(
    target_id: int, body: SweepIn, db: DB, sched: Sched, response: Response
) -> SweepOut:
    sw = sweeps.create_sweep(db, target_id, body)
    if sched is not None:
        sched.wake()  # the scheduler claims it now, not at its next poll
    response.headers["Location"] = f"/api/v1/sweeps/{sw.id}"
    return sweeps.sweep_out(sw)


@router.get("/sweeps", response_model=list[SweepOut])
def list_sweeps(
    db: DB, target_id: int | None = None, limit: int = Query(default=100, ge=1, le=1000)
) -> list[SweepOut]:
    return [sweeps.sweep_out(x) for x in sweeps.list_sweeps(db, target_id, limit)]


@router.get("/sweeps/{sweep_id}", response_model=SweepOut)
def get_sweep(sweep_id: int, db: DB) -> SweepOut:
    return sweeps.sweep_out(sweeps.get_sweep(db, sweep_id))


@router.post("/sweeps/{sweep_id}/cancel", status_code=202, response_model=SweepOut)
def cancel_sweep(sweep_id: int, db: DB) -> SweepOut:
    return sweeps.sweep_out(sweeps.cancel_sweep(db, sweep_id))


@router.get("/sweeps/{sweep_id}/chart.svg")
def sweep_chart(sweep_id: int, db: DB) -> Response:
    sw = sweeps.get_sweep(db, sweep_id)
    points = (sw.result or {}).get("points", [])
    svg = render_sweep_svg(
        points, knee=sw.knee_clients, title=f"Client sweep {sw.id}: tps and p99 vs clients"
    )
    return Response(svg, media_type="image/svg+xml")
