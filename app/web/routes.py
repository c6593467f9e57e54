"""Dashboard pages at ``/``: sessions, one session's live view and results, forms, login.

Server-rendered (Jinja2) over the domain services, like the REST API, and split per
domain like app/api/: index.py (the home page and its forms), targets.py, sessions.py,
sweeps.py, compare.py, captures.py, login.py; app/web/render.py holds what they share
(templates, headers, guards, the ServiceError -> page handler). This module only
assembles their routers (render.py cannot: the domain modules import it).

The only script is ``static/dashboard.js``: it polls the REST API for the live view.
Plain ``def`` routes: the work is sync DB access, run in FastAPI's thread pool. Pages
cost a handful of queries each (no per-row queries) and show bounded lists.
"""

from __future__ import annotations

from fastapi import APIRouter

from app.web import captures, compare, index, login, sessions, sweeps, targets
from app.web.render import PageRoute, assets

__all__ = ["router"]

DOMAINS = (index, sessions, sweeps, compare, captures, targets)

router = APIRouter(include_in_schema=False, route_class=PageRoute)
router.include_router(login.router)
router.include_router(assets)
# every page before every form post: where a path has both (/captures, a session's
# apply and rollback), a request with another method is answered 405 by the page's route
for domain in DOMAINS:
    router.include_router(domain.page)
for domain in DOMAINS:
    router.include_router(domain.post)
