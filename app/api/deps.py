"""Request-scoped access to the app's shared objects, and the bearer-token guard."""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Annotated

from cachetools import TTLCache
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.db import Database
from app.jobs.scheduler import Scheduler
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


@dataclass
class _Failures:
    count: int = 0
    last: float = 0.0
    locked_until: float = 0.0


class AuthThrottle:
    """Wrong tokens per client address: a few free, then an exponential lockout.

    In memory and per process (a restart forgets it). After ``free`` wrong tokens from
    one address, each further one locks the address for 1 s, 2 s, 4 s, ... up to
    ``max_lockout_s``; while locked, every token it presents gets 429 without being
    checked, so guessing runs at most about one try per ``max_lockout_s``. A right token
    resets the count; ``window_s`` without a failure forgets it. Behind a reverse proxy
    every client has the proxy's address and shares one count.

    Addresses are cheap to an attacker with many of them (or behind a proxy that passes
    made-up X-Forwarded-For on), so there is a global budget too: more than
    ``global_per_minute`` wrong tokens within a minute, from all addresses together, lock
    every token check for ``GLOBAL_LOCK_S``. The right token is refused then too: were it
    accepted, the lockout would still tell a right guess from a wrong one.
    """

    GLOBAL_WINDOW_S = 60.0
    GLOBAL_LOCK_S = 60.0

    def __init__(
        self,
        free: int,
        max_lockout_s: float,
        window_s: float = 900.0,
        global_per_minute: int = 60,
    ) -> None:
        self.free, self.max_lockout_s, self.window_s = free, max_lockout_s, window_s
        self.global_per_minute = global_per_minute
        self._lock = threading.Lock()
        # bounded: many addresses cannot grow it without limit
        self._seen: TTLCache[str, _Failures] = TTLCache(maxsize=10_000, ttl=window_s)
        self._recent: deque[float] = deque()  # every failure of the last minute
        self._all_locked_until = 0.0

    def retry_after(self, address: str) -> float:
        """Seconds until ``address`` may present a token again (0: now)."""
        with self._lock:
            f = self._seen.get(address)
            return max(0.0, f.locked_until - time.monotonic()) if f else 0.0

    def global_retry_after(self) -> float:
        """Seconds until any token is checked again (0: now)."""
        with self._lock:
            return max(0.0, self._all_locked_until - time.monotonic())

    def failed(self, address: str) -> None:
        now = time.monotonic()
        with self._lock:
            self._recent.append(now)
            while self._recent and now - self._recent[0] > self.GLOBAL_WINDOW_S:
                self._recent.popleft()
            if len(self._recent) > self.global_per_minute:
                self._all_locked_until = now + self.GLOBAL_LOCK_S
                self._recent.clear()
            f = self._seen.get(address) or _Failures()
            if now - f.last > self.window_s:
                f = _Failures()
            f.count, f.last = f.count + 1, now
            if f.count > self.free:
                f.locked_until = now + min(2.0 ** (f.count - self.free - 1), self.max_lockout_s)
            self._seen[address] = f

    def succeeded(self, address: str) -> None:
        with self._lock:
            self._seen.pop(address, None)


def client_address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def authenticate(request: Request, given: str) -> bool:
    """Whether ``given`` is the service's token, counting wrong ones per client address.

    Raises HTTPException(429) while the address is locked out, or every address is
    (AuthThrottle's global budget). Without a token configured everything is allowed; an
    empty ``given`` is no guess and not counted.
    """
    settings = get_settings(request)
    if settings.api_token is None:
        return True
    if not given:
        return False
    throttle: AuthThrottle = request.app.state.auth_throttle
    wait = throttle.global_retry_after()
    if wait > 0:
        raise HTTPException(
            status_code=429,
            detail=f"too many wrong tokens from all addresses (over "
            f"KNOBTUNE_AUTH_GLOBAL_FAILURES={throttle.global_per_minute} a minute): no token is "
            f"checked for {math.ceil(wait)} s",
            headers={"Retry-After": str(math.ceil(wait))},
        )
    address = client_address(request)
    wait = throttle.retry_after(address)
    if wait > 0:
        raise HTTPException(
            status_code=429,
            detail=f"too many wrong tokens from this address: retry in {math.ceil(wait)} s",
            headers={"Retry-After": str(math.ceil(wait))},
        )
    if token_ok(settings, given):
        throttle.succeeded(address)
        return True
    throttle.failed(address)
    return False


def is_authorized(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> bool:
    return authenticate(request, presented_token(request, creds))


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


def api_router(tag: str) -> APIRouter:
    """A domain's router under /api/v1, behind the token guard.

    Plain `def` routes: their work is sync (psycopg, SQLAlchemy), so FastAPI runs them in
    its thread pool and the event loop never blocks.
    """
    return APIRouter(prefix="/api/v1", dependencies=[Depends(require_token)], tags=[tag])
