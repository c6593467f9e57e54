"""/api/v1/comparisons: ``knobtune compare`` over REST (issue 42), run by the scheduler like a
session: interleaved rounds of named configs on a target, each config's level and each
one's gain over the reference, the target restored."""

from __future__ import annotations

from fastapi import Query, Response

from app.api.deps import DB, AppSettings, Sched, api_router
from app.compare import service
from app.compare.schemas import ComparisonIn, ComparisonOut

router = api_router("comparisons")


@router.post("/comparisons", status_code=202, response_model=ComparisonOut)
def create_comparison(
    body: ComparisonIn, db: DB, settings: AppSettings, sched: Sched, response: Response
) -> ComparisonOut:
    row = service.create_comparison(db, settings, body)
    if sched is not None:
        sched.wake()  # the scheduler claims it now, not at its next poll
    response.headers["Location"] = f"/api/v1/comparisons/{row.id}"
    return service.comparison_out(row, service.target_names(db).get(row.target_id))


@router.get("/comparisons", response_model=list[ComparisonOut])
def list_comparisons(
    db: DB, target_id: int | None = None, limit: int = Query(default=100, ge=1, le=1000)
) -> list[ComparisonOut]:
    names = service.target_names(db)
    rows = service.list_comparisons(db, target_id, limit)
    return [service.comparison_out(r, names.get(r.target_id)) for r in rows]


@router.get("/comparisons/{comparison_id}", response_model=ComparisonOut)
def get_comparison(comparison_id: int, db: DB) -> ComparisonOut:
    row = service.get_comparison(db, comparison_id)
    return service.comparison_out(row, service.target_names(db).get(row.target_id))


@router.post("/comparisons/{comparison_id}/cancel", status_code=202, response_model=ComparisonOut)
def cancel_comparison(comparison_id: int, db: DB) -> ComparisonOut:
    row = service.cancel_comparison(db, comparison_id)
    return service.comparison_out(row, service.target_names(db).get(row.target_id))
