"""What every dashboard page shares: templates and filters, the page response and its
headers, the vendored assets, the guards (login, same-origin posts, the form body), the
route class that turns a service's refusal into a page, and each domain's two routers.

The domain modules (app/web/index.py, targets.py, sessions.py, ...) build their pages
from these; app/web/routes.py assembles their routers.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qsl, quote

from cachetools import TTLCache
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError

from app.api.csrf import cross_site_refusal
from app.api.deps import TOKEN_COOKIE, AppSettings, is_authorized, token_ok
from app.errors import ServiceError
from app.models import ACTIVE_STATUSES
from app.postgres.units import readable
from optimizer.render import status_label

HERE = Path(__file__).parent
MAX_FORM_BYTES = 256 * 1024  # a custom SQL script fits; anything larger is refused
PAGE_TTL_S = 1.0  # a session page is reused this long: the live view polls once a second

# Everything is same-origin and inline SVG needs no style attributes, so the
# policy can forbid inline scripts and styles: an XSS that slipped through
# escaping could not run.
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
    "script-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
_MEDIA = {
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}


def _load_static() -> dict[str, tuple[bytes, str, str]]:
    """Vendored assets, read once: name -> (body, media type, content hash for cache busting)."""
    out: dict[str, tuple[bytes, str, str]] = {}
    for f in sorted((HERE / "static").iterdir()):
        if f.suffix in _MEDIA:
            body = f.read_bytes()
            out[f.name] = (body, _MEDIA[f.suffix], hashlib.sha256(body).hexdigest()[:12])
    return out


STATIC = _load_static()


def static_url(name: str) -> str:
    return f"/static/{name}?v={STATIC[name][2]}"


def fmt_tps(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.1f}"


def fmt_gain(v: float | None) -> str:
    return "–" if v is None else f"{v * 100:+.1f}%"


def fmt_when(v: datetime | None) -> str:
    return "–" if v is None else v.strftime("%Y-%m-%d %H:%M:%S")


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


templates = Jinja2Templates(directory=HERE / "templates")
templates.env.globals.update(static_url=static_url, ACTIVE=ACTIVE_STATUSES)
templates.env.filters.update(
    tps=fmt_tps,
    gain=fmt_gain,
    when=fmt_when,
    duration=fmt_duration,
    claim=status_label,
    readable=readable,
)


def render_page(
    request: Request, name: str, ctx: dict[str, Any], status: int = 200
) -> HTMLResponse:
    settings = request.app.state.settings
    auth = settings.api_token is not None
    # the header says whether this browser is logged in (the login page is not)
    logged_in = auth and token_ok(settings, request.cookies.get(TOKEN_COOKIE, ""))
    ctx = {"auth_enabled": auth, "logged_in": logged_in, **ctx}
    return templates.TemplateResponse(request, name, ctx, status_code=status, headers=HEADERS)


class RenderedPages:
    """Session pages rendered within the last ``PAGE_TTL_S``, per app (bounded, thread-safe).

    Fifty viewers of a running session then cost one render a second instead of fifty
    (a request took 8.5 ms of CPU, 3.3 ms when served from here; bench/api_load.py runs
    on 2 cores shared with pgbench). A page is at most a second stale; the dashboard's
    own cancel drops it.
    """

    def __init__(self, size: int = 256) -> None:
        self._pages: TTLCache[int, bytes] = TTLCache(maxsize=size, ttl=PAGE_TTL_S)
        self._lock = threading.Lock()  # TTLCache is not thread-safe; routes run in a pool

    def get(self, session_id: int) -> bytes | None:
        with self._lock:
            return self._pages.get(session_id)

    def put(self, session_id: int, body: bytes) -> None:
        with self._lock:
            self._pages[session_id] = body

    def forget(self, session_id: int) -> None:
        with self._lock:
            self._pages.pop(session_id, None)


# -- guards -------------------------------------------------------------------------
def page_auth(request: Request, ok: Annotated[bool, Depends(is_authorized)]) -> None:
    """Pages accept the API's Bearer header or the login cookie; browsers go to /login."""
    if not ok:
        here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise HTTPException(303, headers={"Location": "/login?next=" + quote(here, safe="")})


def same_origin(request: Request, settings: AppSettings) -> None:
    """Refuse cross-site form posts (CSRF): a browser always sends Origin on a POST.

    Needed even without a token: otherwise any web page a user visits could
    start sessions on their targets through a plain HTML form. The rule is the API's
    (app/api/csrf.py, whose middleware also runs before this).
    """
    names = ("origin", "sec-fetch-site", "host")
    headers = {k: request.headers[k] for k in names if k in request.headers}
    if cross_site_refusal(request.method, headers, frozenset(settings.allowed_origins)):
        raise HTTPException(403, "cross-site form post refused: use the dashboard's own form")


async def read_form(request: Request) -> dict[str, str]:
    """The posted form, parsed here (urlencoded only), so no multipart library is needed."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/x-www-form-urlencoded":
        raise HTTPException(415, "post the dashboard's form (application/x-www-form-urlencoded)")
    if int(request.headers.get("content-length") or 0) > MAX_FORM_BYTES:
        raise HTTPException(413, f"form larger than {MAX_FORM_BYTES} bytes")
    raw = await request.body()
    if len(raw) > MAX_FORM_BYTES:
        raise HTTPException(413, f"form larger than {MAX_FORM_BYTES} bytes")
    return dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True))


Form = Annotated[dict[str, str], Depends(read_form)]


# -- a service's refusal as a page ----------------------------------------------------
class Shown(Exception):
    """A refusal already rendered on the page that asked (``shown_on``): the route's answer."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


def refused(exc: ValidationError | ServiceError) -> tuple[str, int]:
    """What a form shows when its request is refused, and the status: the fields the body
    got wrong (422), or the service's own message and status."""
    if isinstance(exc, ServiceError):
        return exc.message, exc.status
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]).removeprefix("workload.")
        msg = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts), 422


@contextmanager
def shown_on(view: Callable[[str, int], Response], *, form: bool = False) -> Iterator[None]:
    """A ServiceError in the block is shown on the asking page: ``view(message, status)``
    renders it (a form again with its error, the job's page with why it was not
    cancelled) and that is the route's answer (``PageRoute``). With ``form``, so is the
    body's ValidationError (422, the fields it got wrong: ``refused``).

    A ServiceError raised by ``view`` itself (the job does not exist either) is left to
    ``PageRoute``: the error page.
    """
    try:
        yield
    except ServiceError as exc:
        raise Shown(view(*refused(exc))) from exc
    except ValidationError as exc:
        if not form:
            raise
        raise Shown(view(*refused(exc))) from exc


class PageRoute(APIRoute):
    """A dashboard route: the one place a ServiceError becomes a page. One it lets through
    is the error page, with the service's status and message; one a ``shown_on`` block
    caught is the asking page it rendered. Here and not in an app-wide handler, so the
    REST API's routes keep answering it in JSON (app/api/errors.py)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def page_or_error(request: Request) -> Response:
            try:
                return await handle(request)
            except Shown as shown:
                return shown.response
            except ServiceError as exc:
                return render_page(request, "error.html", {"message": exc.message}, exc.status)

        return page_or_error


def page_routers() -> tuple[APIRouter, APIRouter]:
    """A domain's two routers: its pages (behind the login) and its form posts (behind the
    login and the same-origin check)."""
    page = APIRouter(
        include_in_schema=False, route_class=PageRoute, dependencies=[Depends(page_auth)]
    )
    post = APIRouter(
        include_in_schema=False,
        route_class=PageRoute,
        dependencies=[Depends(page_auth), Depends(same_origin)],
    )
    return page, post


# -- vendored assets ------------------------------------------------------------------------
assets = APIRouter(include_in_schema=False, route_class=PageRoute)


@assets.get("/static/{name}")
def static(name: str) -> Response:
    item = STATIC.get(name)
    if item is None:
        raise HTTPException(404, f"no static file {name!r}")
    body, media, _ = item
    # URLs carry the content hash (static_url), so browsers may keep them for good.
    headers = {**HEADERS, "Cache-Control": "public, max-age=31536000, immutable"}
    return Response(body, media_type=media, headers=headers)
