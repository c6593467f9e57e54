"""The FastAPI application: wiring of settings, metadata DB, scheduler and routers."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi_offline import FastAPIOffline
from sqlalchemy import func, select, text
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import db as dbmod
from app import vault, workloads
from app.api.captures import IMPORT_PATH
from app.api.csrf import CrossSiteGuard
from app.api.deps import AuthThrottle, require_token
from app.api.errors import service_error
from app.api.v1 import ROUTERS
from app.captures import store as capture_store
from app.errors import ServiceError
from app.jobs.scheduler import Scheduler
from app.models import Trial, TuningSession
from app.postgres import connect as target_connect
from app.postgres import privilege
from app.postgres.dsn import install_log_scrub
from app.postgres.pgbench import remove_orphan_rundirs
from app.postgres.sandbox import remove_orphan_templates
from app.settings import Settings, get_settings
from app.targets.location import drop_empty_fallback
from app.targets.sandboxes import start_sandboxes, stop_sandboxes
from app.targets.service import remember_sandboxes, seal_stored_secrets
from app.web.render import RenderedPages
from app.web.routes import router as web_router

log = logging.getLogger(__name__)


def _json_safe(value: Any) -> Any:
    """``value`` encoded for JSON, with non-finite floats as their names ("inf", "nan")."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return jsonable_encoder(value)


def service_key(settings: Settings) -> tuple[str, str]:
    """The secret key text and where it comes from (app.vault.service_key)."""
    given = settings.secret_key.get_secret_value() if settings.secret_key else None
    return vault.service_key(
        given, settings.secret_key_file, settings.work_dir, settings.database_url
    )


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """`knobtune serve`'s uvicorn options that the settings decide: trusted proxies, the
    header deadline (app/api/transport.py). Imported here: uvicorn's protocol modules
    cost 0.2 s of CPU at import, and only `knobtune serve` needs them."""
    from app.api import transport

    return transport.uvicorn_options(settings)


def check_key(settings: Settings, db: dbmod.Database) -> None:
    """After the upgrade: the key holds every key the metadata DB's secrets need."""
    key, source = service_key(settings)
    vault.check_key(db.engine, key, source=source, instance=settings.instance_id)


def secure_startup(settings: Settings) -> None:
    """Before the metadata DB opens: private files, the secret key, the children's user.

    Fails the start with a message that says what to change (an unusable key or
    unprivileged user), rather than serving with a hole.
    """
    vault.private_work_dir(settings.work_dir)
    vault.private_sqlite(settings.database_url)
    key, source = service_key(settings)
    vault.configure(key, settings.work_dir, source)
    privilege.configure(settings.run_as_user)
    if privilege.dropping():
        privilege.child_identity()  # raises PrivilegeError naming the fix
    install_log_scrub()


class BodyTooLarge(StarletteHTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body larger than {limit} bytes")


class BodyLimit:
    """413 for a request body over ``limit`` bytes: by its Content-Length, or counted as
    it streams in (chunked), before a route parses it. Pure ASGI, so it covers every
    route, the dashboard's forms included. ``routes`` gives single routes (method, path)
    a limit of their own, with the setting that sets it: a captured log's import takes
    up to KNOBTUNE_CAPTURE_MAX_BYTES, and only that route."""

    def __init__(
        self,
        app: ASGIApp,
        limit: int,
        routes: dict[tuple[str, str], tuple[int, str]] | None = None,
    ) -> None:
        self.app, self.limit = app, limit
        self.routes = dict(routes or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, setting = self.routes.get(
            (scope["method"], scope["path"]), (self.limit, "KNOBTUNE_MAX_BODY_BYTES")
        )
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    too_big = int(value) > limit
                except ValueError:
                    too_big = False  # the server rejects a malformed length itself
                if too_big:
                    await self._refuse(scope, receive, send, limit, setting)
                    return
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)  # FastAPI answers it (HTTPException)
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BodyTooLarge:
            if started:
                raise
            await self._refuse(scope, receive, send, limit, setting)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, limit: int, setting: str
    ) -> None:
        detail = f"request body larger than {limit} bytes ({setting})"
        await JSONResponse({"detail": detail}, status_code=413)(scope, receive, send)


# Requests whose work connects to a target: registering one, a session's or a comparison's
# preflight, a sweep's server facts, a capture's checks, applying or rolling back a
# recommendation, a session started from a capture's page (REST and dashboard).
TARGET_WORK = re.compile(
    r"/(api/v1/)?(targets|sessions|captures|comparisons)"
    r"|/(api/v1/)?targets/\d+(/sweeps)?"
    r"|/(api/v1/)?sessions/\d+/(apply|rollback)"
    r"|/captures/\d+/sessions"
)


def connects_to_a_target(method: str, path: str) -> bool:
    return method in ("POST", "PATCH") and TARGET_WORK.fullmatch(path) is not None


class TargetWorkLimit:
    """At most ``limit`` requests connecting to targets at once; more get 503 now.

    A connect to a target that never answers holds a worker thread until it times out;
    sixty of them took all of the thread pool, and GET /api/v1/targets waited 9 s.
    Refused here, before a thread is taken, so reads always find one.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit, self.busy = app, limit, 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not connects_to_a_target(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        if self.busy >= self.limit:  # one event loop: no await between check and count
            detail = (
                f"{self.busy} requests are already connecting to targets "
                "(KNOBTUNE_TARGET_CONNECTS); retry shortly"
            )
            headers = {"Retry-After": "5"}
            await JSONResponse({"detail": detail}, 503, headers)(scope, receive, send)
            return
        self.busy += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.busy -= 1


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        secure_startup(settings)
        dbmod.upgrade(settings.database_url)
        vault.private_sqlite(settings.database_url)  # files SQLite made during the upgrade
        db = dbmod.Database(settings.database_url)
        try:
            check_key(settings, db)  # another process's key: refuse, before any work
        except BaseException:
            db.dispose()
            raise
        seal_stored_secrets(db)  # plain-text DSNs of an older version: encrypted now
        # where targets' connections may go (KNOBTUNE_TARGET_HOSTS, the managed sandboxes;
        # the CLI's in-process mode: anywhere): app/postgres/connect.py
        previous_policy = target_connect.configure(target_connect.policy_for(settings))
        remember_sandboxes(db)
        # captured logs live under this service's work directory; the replay workload
        # (below app/captures) gets its loader handed over here
        capture_store.configure(settings.work_dir)
        workloads.set_capture_loader(
            functools.partial(capture_store.load_log, work_dir=settings.work_dir)
        )
        app.state.db = db
        app.state.scheduler = None
        if settings.run_scheduler:
            # left by an earlier process that was killed mid-run
            remove_orphan_rundirs()
            remove_orphan_templates()
            target_connect.remove_orphan_homes()
            start_sandboxes(db)
            sched = Scheduler(db, settings)
            sched.start()
            app.state.scheduler = sched
        try:
            yield
        finally:
            if app.state.scheduler is not None:
                # Its runners put their targets back first: a sandbox or the connection
                # policy must not go while a runner still restores through it.
                await asyncio.to_thread(app.state.scheduler.shutdown, settings.shutdown_grace_s)
                # Managed sandboxes live with the service: started again at its next start.
                stop_sandboxes(db, settings)
            drop_empty_fallback(settings)
            db.dispose()
            target_connect.configure(previous_policy)  # an app run inside another's process

    # FastAPIOffline serves /docs from assets bundled in its package: no CDN, so the API
    # docs work on a machine without internet, like the rest of the service.
    app = FastAPIOffline(
        title="knobtune",
        version="0.1.0",
        description="Tunes a PostgreSQL server's knobs by noise-aware coordinate descent.",
        lifespan=lifespan,
        # JSON bodies only with a JSON Content-Type (FastAPI >= 0.132; an error before):
        # a foreign page's text/plain or type-less POST is not parsed as JSON (CSRF).
        strict_content_type=True,
    )
    app.state.settings = settings
    app.state.pages = RenderedPages()
    app.state.auth_throttle = AuthThrottle(
        settings.auth_free_failures,
        settings.auth_lockout_max_s,
        global_per_minute=settings.auth_global_failures,
    )
    # added last = runs first: the Host check, the cross-site check, then the body limit,
    # then the connect limit
    app.add_middleware(TargetWorkLimit, limit=settings.target_connects)
    app.add_middleware(
        BodyLimit,
        limit=settings.max_body_bytes,
        routes={
            ("POST", IMPORT_PATH): (
                max(settings.capture_max_bytes, settings.max_body_bytes),
                "KNOBTUNE_CAPTURE_MAX_BYTES",
            )
        },
    )
    app.add_middleware(CrossSiteGuard, allowed_origins=settings.allowed_origins)
    app.add_middleware(
        TrustedHostMiddleware, allowed_hosts=settings.allowed_hosts, www_redirect=False
    )

    app.add_exception_handler(ServiceError, service_error)

    @app.exception_handler(RequestValidationError)
    def _invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # Where and what, never the input: FastAPI's own handler echoes it (a 50 MB body
        # came back whole, a DSN's password too). JSON has no inf or NaN: a body with
        # 1e400 or NaN made the error itself fail to encode (a 500, not a 422).
        detail = [
            {
                "type": str(err.get("type", "")),
                "loc": list(err.get("loc", ())),
                "msg": str(err.get("msg", "")).removeprefix("Value error, "),
            }
            for err in exc.errors()
        ]
        return JSONResponse(status_code=422, content={"detail": _json_safe(detail)})

    @app.exception_handler(OperationalError)
    def _metadata_db_down(_request: Request, exc: OperationalError) -> JSONResponse:
        # The metadata DB is unreachable: a temporary condition, not a server bug.
        log.warning("metadata DB unavailable: %s", exc.orig)
        return JSONResponse(
            status_code=503,
            content={"detail": "the metadata database is unavailable; retry shortly"},
            headers={"Retry-After": "5"},
        )

    for router in ROUTERS:
        app.include_router(router)
    app.include_router(web_router)

    @app.get("/healthz", tags=["meta"])
    def healthz(request: Request) -> dict[str, object]:
        db: dbmod.Database = request.app.state.db
        with db.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        sched: Scheduler | None = request.app.state.scheduler
        return {
            "status": "ok",
            "instance": settings.instance_id,
            "running_sessions": sorted(sched.running()) if sched else [],
        }

    # Like the API: with a token configured, scrapers send it (Prometheus: authorization).
    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        tags=["meta"],
        dependencies=[Depends(require_token)],
    )
    def metrics(request: Request) -> str:
        db: dbmod.Database = request.app.state.db
        with db.session() as s:
            by_status = dict(
                s.execute(
                    select(TuningSession.status, func.count()).group_by(TuningSession.status)
                ).all()
            )
            trials = s.scalar(select(func.count(Trial.id))) or 0
            bench_s = (
                s.scalar(select(func.coalesce(func.sum(TuningSession.benchmark_s), 0.0))) or 0.0
            )
        lines = [
            "# HELP knobtune_sessions Tuning sessions by status.",
            "# TYPE knobtune_sessions gauge",
        ]
        for status in ("queued", "running", "succeeded", "failed", "cancelled"):
            lines.append(f'knobtune_sessions{{status="{status}"}} {by_status.get(status, 0)}')
        lines += [
            "# HELP knobtune_trials_total Benchmark trials recorded.",
            "# TYPE knobtune_trials_total counter",
            f"knobtune_trials_total {trials}",
            "# HELP knobtune_benchmark_seconds_total Seconds spent benchmarking.",
            "# TYPE knobtune_benchmark_seconds_total counter",
            f"knobtune_benchmark_seconds_total {float(bench_s):.3f}",
        ]
        return "\n".join(lines) + "\n"

    return app
