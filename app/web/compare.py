"""Comparisons (issue 42): a comparison's page and cancelling it."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app.api.deps import DB
from app.compare import service as compare_svc
from app.db import Database
from app.targets import service as target_svc
from app.web.render import page_routers, render_page, shown_on

page, post = page_routers()


def _comparison_page(
    request: Request, db: Database, comparison_id: int, error: str | None = None, status: int = 200
) -> HTMLResponse:
    row = compare_svc.get_comparison(db, comparison_id)
    target = target_svc.get_target(db, row.target_id)  # a 404 page when it is gone
    ctx = {"c": compare_svc.comparison_out(row, target.name), "error": error}
    return render_page(request, "comparison.html", ctx, status)


@page.get("/comparisons/{comparison_id}", response_class=HTMLResponse)
def comparison_page(comparison_id: int, request: Request, db: DB) -> HTMLResponse:
    return _comparison_page(request, db, comparison_id)


@post.post("/comparisons/{comparison_id}/cancel")
def cancel_comparison(comparison_id: int, request: Request, db: DB) -> Response:
    with shown_on(
        lambda message, status: _comparison_page(
            request, db, comparison_id, error=message, status=status
        )
    ):
        compare_svc.cancel_comparison(db, comparison_id)
    return RedirectResponse(f"/comparisons/{comparison_id}", status_code=303)
