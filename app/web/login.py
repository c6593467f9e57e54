"""Login and logout (only meaningful when KNOBTUNE_API_TOKEN is set): the token, once
given, rides in an HttpOnly cookie."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app.api.deps import TOKEN_COOKIE, AppSettings, authenticate
from app.web.render import Form, PageRoute, render_page, same_origin

COOKIE_MAX_AGE_S = 7 * 86_400

router = APIRouter(include_in_schema=False, route_class=PageRoute)


def _safe_next(value: str | None) -> str:
    """Only same-site paths: an open redirect would let a link send users elsewhere."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, settings: AppSettings, next: str = "/") -> Response:
    if settings.api_token is None:
        return RedirectResponse(_safe_next(next), status_code=303)
    return render_page(request, "login.html", {"next": _safe_next(next), "error": None})


@router.post("/login", dependencies=[Depends(same_origin)])
def login(request: Request, settings: AppSettings, form: Form) -> Response:
    nxt = _safe_next(form.get("next"))
    if settings.api_token is None:
        return RedirectResponse(nxt, status_code=303)
    given = form.get("token", "").strip()
    try:
        ok = authenticate(request, given)  # counts wrong tokens per address (429 when locked)
    except HTTPException as exc:
        if exc.status_code != 429:
            raise
        locked = render_page(request, "login.html", {"next": nxt, "error": exc.detail}, 429)
        locked.headers.update(exc.headers or {})
        return locked
    if not ok:
        ctx = {"next": nxt, "error": "wrong token: give the service's KNOBTUNE_API_TOKEN"}
        return render_page(request, "login.html", ctx, 401)
    resp = RedirectResponse(nxt, status_code=303)
    # HttpOnly: page scripts never see it; SameSite=Lax: other sites' POSTs don't carry it.
    resp.set_cookie(
        TOKEN_COOKIE,
        given,
        max_age=COOKIE_MAX_AGE_S,
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
        path="/",
    )
    return resp


@router.post("/logout", dependencies=[Depends(same_origin)])
def logout() -> Response:
    resp = RedirectResponse("/login", status_code=303)
    resp.delete_cookie(TOKEN_COOKIE, path="/")
    return resp
