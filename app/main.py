"""The FastAPI application: wiring of settings, metadata DB, scheduler and routers."""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi_offline import FastAPIOffline
from sqlalchemy import func, select, text
from sqlalchemy.exc import OperationalError

from app import db as dbmod
from app.api.routes import router
from app.models import Trial, TuningSession
from app.scheduler import Scheduler
from app.service import ServiceError, start_sandboxes, stop_sandboxes
from app.settings import Settings, get_settings
from app.web.routes import RenderedPages
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


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        dbmod.upgrade(settings.database_url)
        db = dbmod.Database(settings.database_url)
        app.state.db = db
        app.state.scheduler = None
        if settings.run_scheduler:
            start_sandboxes(db)
            sched = Scheduler(db, settings)
            sched.start()
            app.state.scheduler = sched
        try:
            yield
        finally:
            if app.state.scheduler is not None:
                app.state.scheduler.shutdown()
                # Managed sandboxes live with the service: started again at its next start.
                stop_sandboxes(db, settings.work_dir)
            db.dispose()

    # FastAPIOffline serves /docs from assets bundled in its package: no CDN, so the API
    # docs work on a machine without internet, like the rest of the service.
    app = FastAPIOffline(
        title="knobtune",
        version="0.1.0",
        description="Tunes a PostgreSQL server's knobs by noise-aware coordinate descent.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.pages = RenderedPages()

    @app.exception_handler(ServiceError)
    def _service_error(_request: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse(status_code=exc.status, content={"detail": exc.message})

    @app.exception_handler(RequestValidationError)
    def _invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own handler echoes the input, and JSON has no inf or NaN: a body
        # with 1e400 or NaN made the error itself fail to encode (a 500, not a 422).
        return JSONResponse(status_code=422, content={"detail": _json_safe(exc.errors())})

    @app.exception_handler(OperationalError)
    def _metadata_db_down(_request: Request, exc: OperationalError) -> JSONResponse:
        # The metadata DB is unreachable: a temporary condition, not a server bug.
        log.warning("metadata DB unavailable: %s", exc.orig)
        return JSONResponse(
            status_code=503,
            content={"detail": "the metadata database is unavailable; retry shortly"},
            headers={"Retry-After": "5"},
        )

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

    @app.get("/metrics", response_class=PlainTextResponse, tags=["meta"])
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
