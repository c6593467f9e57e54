"""Cross-site request refusal (CSRF): state-changing requests from other sites' pages.

A browser lets any page it shows send a POST to any address the browser can reach,
with the user's cookies and network position (a service on loopback, without a token, is
reachable from every page the user opens). What the browser cannot forge is where such a
request comes from: it sends ``Origin`` on every cross-origin POST, PUT, PATCH and DELETE,
and a modern one sends ``Sec-Fetch-Site`` too. A request is refused (403) when either says
another site sent it:

- an ``Origin`` that is neither this service's own (its ``host[:port]`` is the request's
  ``Host``, as the browser put it) nor one the operator lists in
  ``KNOBTUNE_ALLOWED_ORIGINS`` (``Origin: null``, from sandboxed frames and ``file:``
  pages, never matches);
- without ``Origin``, ``Sec-Fetch-Site: cross-site``.

Clients that are not browsers (the CLI via httpx, curl, scripts) send neither header and
pass: they are guarded by the token. The check runs as ASGI middleware before routing,
so it covers every route, a 404 or 405 included, before a body is read.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from app.settings import normalize_origin

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def cross_site_refusal(
    method: str, headers: dict[str, str], allowed_origins: frozenset[str]
) -> str | None:
    """Why this request is refused as cross-site (None: it is not). ``headers`` by
    lower-case name."""
    if method.upper() not in UNSAFE_METHODS:
        return None
    origin = headers.get("origin")
    if origin is not None:
        own = headers.get("host", "").lower()
        try:
            given = normalize_origin(origin)
        except ValueError:
            given = origin.strip().lower()  # "null" or junk: matches nothing below
        if (own and urlsplit(given).netloc == own) or given in allowed_origins:
            return None  # the operator's listed origins may sit on another site
        return (
            f"cross-site request refused: it came from a page of {origin.strip()[:100]!r}, "
            f"not of this service ({own[:100] or 'no Host'}). To let that origin's pages "
            "change things here, list it in KNOBTUNE_ALLOWED_ORIGINS; scripts and the CLI "
            "send no Origin header"
        )
    if headers.get("sec-fetch-site", "").strip().lower() == "cross-site":
        return (
            "cross-site request refused (Sec-Fetch-Site: cross-site): another site's page "
            "sent it. Use the dashboard, the CLI or a client that is not a browser"
        )
    return None


class CrossSiteGuard:
    """403 for a state-changing request another site's page sent (module doc)."""

    def __init__(self, app: ASGIApp, allowed_origins: list[str] | tuple[str, ...] = ()) -> None:
        self.app = app
        self.allowed = frozenset(normalize_origin(o) for o in allowed_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in UNSAFE_METHODS:
            await self.app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        for name, value in scope.get("headers", []):
            key = name.decode("latin-1").lower()
            if key in ("origin", "sec-fetch-site", "host") and key not in headers:
                headers[key] = value.decode("latin-1")
        reason = cross_site_refusal(scope["method"], headers, self.allowed)
        if reason is None:
            await self.app(scope, receive, send)
            return
        await JSONResponse({"detail": reason}, status_code=403)(scope, receive, send)
