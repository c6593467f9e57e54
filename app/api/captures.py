"""/api/v1/captures: workload captures (issue 28): live from a target, or an imported log.

A capture's statements are the user's data: no route shows them except the explicit
download of the log (``GET /captures/{id}/log``), which needs the token like every route.
"""

from __future__ import annotations

from fastapi import HTTPException, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from app.api.deps import DB, AppSettings, Sched, api_router
from app.captures import service, store
from app.captures.schemas import CAPTURE_NAME, CaptureIn, CaptureOut
from app.errors import ServiceError
from app.models import Capture

router = api_router("captures")
IMPORT_PATH = "/api/v1/captures/import"  # the one route whose body may be a whole log
# What an import's body may be sent as: the CLI sends gzip. Not text/plain (nor no type):
# a foreign web page can POST those without a CORS preflight (a CSRF import).
IMPORT_TYPES = ("application/gzip", "application/x-gzip", "application/octet-stream")


def _import_type(request: Request) -> None:
    given = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if given not in IMPORT_TYPES:
        raise HTTPException(
            415,
            f"send the log with Content-Type {' or '.join(IMPORT_TYPES[::2])} (its bytes "
            f"plain or gzip-compressed), not {given or 'none'}; the CLI does: knobtune "
            "captures import FILE --name NAME",
        )


def _out(db: DB, cap: Capture) -> CaptureOut:
    names = service.target_names(db) if cap.target_id is not None else {}
    return service.capture_out(cap, names.get(cap.target_id or 0))


@router.post("/captures", status_code=202, response_model=CaptureOut)
def create_capture(body: CaptureIn, db: DB, sched: Sched, response: Response) -> CaptureOut:
    """Log every statement of the target for ``seconds``, then put its settings back."""
    cap = service.create_capture(db, body)
    if sched is not None:
        sched.wake()  # the scheduler claims it now, not at its next poll
    response.headers["Location"] = f"/api/v1/captures/{cap.id}"
    return _out(db, cap)


@router.post("/captures/import", status_code=201, response_model=CaptureOut)
async def import_capture(
    request: Request,
    db: DB,
    settings: AppSettings,
    response: Response,
    name: str = Query(max_length=100, pattern=CAPTURE_NAME),
    database: str | None = Query(default=None, min_length=1, max_length=63),
) -> CaptureOut:
    """A capture from a server log sent as the body: text, or gzip (by its magic bytes),
    at most KNOBTUNE_CAPTURE_MAX_BYTES of text, sent as application/gzip or
    application/octet-stream. The service never opens a file a client names: the client
    uploads the log."""
    _import_type(request)  # before the body is read
    body = await request.body()
    cap = await run_in_threadpool(
        service.import_capture, db, settings, name=name, database=database, body=body
    )
    response.headers["Location"] = f"/api/v1/captures/{cap.id}"
    return _out(db, cap)


@router.get("/captures", response_model=list[CaptureOut])
def list_captures(db: DB, limit: int = Query(default=100, ge=1, le=1000)) -> list[CaptureOut]:
    names = service.target_names(db)
    return [
        service.capture_out(c, names.get(c.target_id or 0))
        for c in service.list_captures(db, limit)
    ]


@router.get("/captures/{capture_id}", response_model=CaptureOut)
def get_capture(capture_id: int, db: DB) -> CaptureOut:
    return _out(db, service.get_capture(db, capture_id))


@router.post("/captures/{capture_id}/cancel", status_code=202, response_model=CaptureOut)
def cancel_capture(capture_id: int, db: DB) -> CaptureOut:
    """Stop a live capture: its settings are put back, what it logged is kept."""
    return _out(db, service.cancel_capture(db, capture_id))


@router.delete("/captures/{capture_id}", status_code=204)
def delete_capture(capture_id: int, db: DB, settings: AppSettings) -> Response:
    """Delete the capture's log file and its record (a running one: cancel it first)."""
    service.delete_capture(db, settings, capture_id)
    return Response(status_code=204)


@router.get("/captures/{capture_id}/log")
def download_log(capture_id: int, db: DB, settings: AppSettings) -> Response:
    """The captured log itself, gzip-compressed: the statements with their values.

    For its owner to check what was recorded, or to replay it with pgreplay elsewhere;
    the token that allows this also allows reading the target's data directly.
    """
    cap = service.get_capture(db, capture_id)
    try:
        packed = store.read_gzip(settings.work_dir, cap.id)
    except store.CaptureUnreadable as exc:
        raise ServiceError(404 if "no stored log" in str(exc) else 409, str(exc)) from None
    return Response(
        packed,
        media_type="application/gzip",
        headers={
            "Content-Disposition": f'attachment; filename="capture-{cap.id}.log.gz"',
            "Cache-Control": "no-store",
        },
    )
