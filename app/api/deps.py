"""Request-scoped access to the app's shared objects, and the bearer-token guard."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.db import Database
from app.scheduler import Scheduler
from app.settings import Settings

# Set by the dashboard's /login form; same-origin fetches of the dashboard's JS send it.
TOKEN_COOKIE = "knobtune_token"  # noqa: S105 - the cookie's name, not a secret
_bearer = HTTPBearer(auto_error=False, description="KNOBTUNE_API_TOKEN, when the service has one")


def get_db(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_scheduler(request: Request) -> Scheduler | None:
    sched: Scheduler | None = request.app.state.scheduler
    return sched


def presented_token(request: Request, creds: HTTPAuthorizationCredentials | None) -> str:
    """The Bearer header's token, else the dashboard's login cookie, else ''."""
    if creds is not None and creds.scheme.lower() == "bearer":
        return creds.credentials
    return request.cookies.get(TOKEN_COOKIE, "")


def token_ok(settings: Settings, given: str) -> bool:
    token = settings.api_token
    if token is None:
        return True
    # Constant-time compare: the token must not leak through response timing.
    return secrets.compare_digest(given.encode(), token.get_secret_value().encode())


def is_authorized(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> bool:
    return token_ok(get_settings(request), presented_token(request, creds))


def require_token(ok: Annotated[bool, Depends(is_authorized)]) -> None:
    if not ok:
        raise HTTPException(
            status_code=401,
            detail="missing or wrong token: send 'Authorization: Bearer <KNOBTUNE_API_TOKEN>' "
            "(browsers: log in at /login)",
            headers={"WWW-Authenticate": "Bearer"},
        )


DB = Annotated[Database, Depends(get_db)]
AppSettings = Annotated[Settings, Depends(get_settings)]
Sched = Annotated[Scheduler | None, Depends(get_scheduler)]
