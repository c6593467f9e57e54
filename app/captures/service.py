"""Captures as a user sees them: start a live capture, import a log, get, list, cancel, delete.

A live capture is checked here, before anything is stored: the target is free, and its
role may change the logging settings and read the server's log through SQL (each missing
piece is a 422 that says what to change, and that an imported log is the other way in).
The scheduler claims it and app/captures/runner.py runs it. An import is parsed and stored
at once. Nothing here ever puts a captured statement into a message: errors name line
numbers, settings and roles; summaries show normalized queries.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from app.captures import store
from app.captures import summary as summaries
from app.captures.schemas import CAPTURE_NAME, CAPTURE_NAME_RULE, CaptureIn, CaptureOut
from app.db import Database, utcnow
from app.errors import ServiceError, to_id
from app.lease import request_cancel
from app.models import ACTIVE_STATUSES, Capture, Target
from app.postgres.connect import connect_target
from app.postgres.dsn import mask_dsn, scrub
from app.postgres.serverlog import access_problems
from app.settings import Settings
from app.targets.holds import server_holder
from app.targets.recommend import refuse_if_recommend_only
from app.targets.service import ensure_server_id

CONNECT_TIMEOUT_S = 10


def default_database(dsn: str) -> str:
    """The database a DSN connects to (libpq's default: the user's name)."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error:
        return "postgres"
    return str(params.get("dbname") or params.get("user") or "postgres")


def check_name(db: Database, name: str) -> None:
    """422 for a name that breaks the rule, 409 for one another capture has."""
    if not re.fullmatch(CAPTURE_NAME, name):
        raise ServiceError(422, f"capture name: {CAPTURE_NAME_RULE}")
    with db.session() as s:
        other = s.scalar(select(Capture.id).where(Capture.name == name))
    if other is not None:
        raise ServiceError(
            409,
            f"capture {other} is already named {name!r}: choose another name, or delete it first",
            fix="list-captures",
        )


def create_capture(db: Database, body: CaptureIn) -> Capture:
    """A queued live capture of the target; the scheduler claims and runs it."""
    with db.session() as s:
        target = s.get(Target, to_id(body.target_id))
        if target is None or target.retired_at is not None:
            raise ServiceError(
                422,
                f"unknown target_id {body.target_id}: register the server first",
                fix="register-target",
            )
    refuse_if_recommend_only(target, "be captured live (that changes its logging settings)")
    check_name(db, body.name)
    ensure_server_id(db, target)
    with db.session() as s:
        held = server_holder(s, target)
    if held is not None:
        raise ServiceError(409, f"{held}; wait or cancel it")
    database = body.database or default_database(target.dsn)
    problems = _access(target.dsn, database)
    if problems:
        raise ServiceError(
            422,
            f"cannot capture on target {target.name!r}: " + "; ".join(problems),
            fix="import-capture",
        )
    cap = Capture(
        name=body.name,
        target_id=target.id,
        source="live",
        database=database,
        status="queued",
        phase="queued",
        request=body.model_dump(mode="json") | {"database": database},
        truncated=False,
        notes=[],
        cancel_requested=False,
        attempts=0,
        created_at=utcnow(),
    )
    try:
        with db.session() as s:
            # FOR UPDATE on PostgreSQL: two POSTs for one target take turns here
            row = s.get(Target, target.id, with_for_update=True)
            held = server_holder(s, row) if row is not None else None
            if held is not None:
                raise ServiceError(409, f"{held}; wait or cancel it")
            s.add(cap)
    except IntegrityError:
        # the name, or one active capture per target: another request won the race
        raise ServiceError(
            409, f"target {target.name!r} just got another capture, or the name was taken"
        ) from None
    return cap


def _access(dsn: str, database: str) -> list[str]:
    """What stops a capture on the target (app.postgres.serverlog.access_problems)."""
    try:
        with connect_target(dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
            return access_problems(conn, database=database)
    except psycopg.Error as exc:
        said = scrub(" ".join(str(exc).split()), dsn)[:300]
        raise ServiceError(422, f"cannot connect to {mask_dsn(dsn)}: {said}") from None


def import_capture(
    db: Database, settings: Settings, *, name: str, database: str | None, body: bytes
) -> Capture:
    """A capture from an uploaded log (plain or gzip), parsed and stored at once."""
    check_name(db, name)
    if database is not None and not 1 <= len(database) <= 63:
        raise ServiceError(422, "database: a database name of 1 to 63 characters")
    try:
        text = store.decode_upload(body, settings.capture_max_bytes)
    except store.CaptureTooLarge as exc:
        raise ServiceError(413, str(exc)) from None
    except ValueError as exc:
        raise ServiceError(422, f"the body is not a log: {exc}") from None
    if not text.strip():
        raise ServiceError(422, "the body is empty: send the server's log file as the body")
    try:
        parsed = summaries.parse(text, database)
        if database is None:
            found = summaries.databases_of(parsed)
            if len(found) != 1:
                raise ServiceError(
                    422,
                    "the log holds "
                    + (f"sessions of {len(found)} databases" if found else "no session")
                    + (f" ({', '.join(found[:5])})" if found else "")
                    + ": give database=NAME, the database whose statements to keep",
                )
            database = found[0]
        if not parsed.statements:
            raise ServiceError(
                422,
                f"the log holds no statement of database {database!r}: it must be a server "
                "log written with log_statement = 'all' and log_line_prefix = "
                "'%m|%u|%d|%c|' (or a csvlog, or RDS's or Cloud SQL's default prefix)",
            )
        result = summaries.build(parsed, None)
    except summaries.LogFormatProblem as exc:
        raise ServiceError(422, f"the log cannot be read: {exc}") from None
    cap = Capture(
        name=name,
        target_id=None,
        source="import",
        database=database,
        status="succeeded",
        phase="imported",
        request={"name": name, "database": database},
        summary=result,
        raw_bytes=len(text.encode("utf-8")),
        truncated=False,
        notes=[],
        cancel_requested=False,
        attempts=0,
        created_at=utcnow(),
        started_at=utcnow(),
        finished_at=utcnow(),
    )
    try:
        with db.session() as s:
            s.add(cap)
            s.flush()  # its id names the file
            try:
                cap.stored_bytes = store.write_log(settings.work_dir, cap.id, text)
            except BaseException:
                store.delete_log(settings.work_dir, cap.id)
                raise
    except IntegrityError:
        raise ServiceError(409, f"the name {name!r} was just taken by another capture") from None
    return cap


def get_capture(db: Database, capture_id: int) -> Capture:
    with db.session() as s:
        cap = s.get(Capture, to_id(capture_id))
        if cap is None:
            raise ServiceError(404, f"no capture {capture_id}", fix="list-captures")
        return cap


def find_capture(db: Database, ref: str) -> Capture:
    """A capture by id or name."""
    with db.session() as s:
        cap = s.scalar(select(Capture).where(Capture.name == ref))
    if cap is not None:
        return cap
    if ref.isdigit():
        return get_capture(db, int(ref))
    raise ServiceError(404, f"no capture {ref!r}", fix="list-captures")


def list_captures(db: Database, limit: int = 100) -> list[Capture]:
    with db.session() as s:
        return list(s.scalars(select(Capture).order_by(Capture.id.desc()).limit(limit)).all())


def cancel_capture(db: Database, capture_id: int) -> Capture:
    with db.session() as s:
        stopping = "cancelling: the logging settings are being put back"
        outcome = request_cancel(s, Capture, to_id(capture_id), stopping)
        cap = s.get(Capture, to_id(capture_id))
        if cap is None:
            raise ServiceError(404, f"no capture {capture_id}", fix="list-captures")
        if outcome is None:
            raise ServiceError(409, f"capture {capture_id} is already {cap.status}")
        if outcome == "cancelled":
            cap.notes = [*cap.notes, "cancelled before it started: nothing was changed"]
        return cap


def delete_capture(db: Database, settings: Settings, capture_id: int) -> None:
    """Delete a capture's log file and its row (a running one: cancel it first)."""
    with db.session() as s:
        cap = s.get(Capture, to_id(capture_id), with_for_update=True)
        if cap is None:
            raise ServiceError(404, f"no capture {capture_id}", fix="list-captures")
        if cap.status in ACTIVE_STATUSES:
            raise ServiceError(
                409,
                f"capture {capture_id} is {cap.status}: cancel it first (its logging settings "
                "are put back and what it logged is kept), then delete it",
            )
        store.delete_log(settings.work_dir, cap.id)
        s.delete(cap)


def target_names(db: Database) -> dict[int, str]:
    with db.session() as s:
        return {int(i): str(n) for i, n in s.execute(select(Target.id, Target.name)).all()}


def capture_out(cap: Capture, target_name: str | None = None) -> CaptureOut:
    elapsed = None
    if cap.started_at is not None:
        elapsed = round(((cap.finished_at or utcnow()) - cap.started_at).total_seconds(), 1)
    seconds: Any = (cap.request or {}).get("seconds")
    return CaptureOut(
        id=cap.id,
        name=cap.name,
        source=cap.source,
        target_id=cap.target_id,
        target_name=target_name,
        database=cap.database,
        status=cap.status,
        phase=cap.phase,
        seconds=int(seconds) if isinstance(seconds, int) else None,
        elapsed_s=elapsed,
        raw_bytes=cap.raw_bytes,
        stored_bytes=cap.stored_bytes,
        truncated=cap.truncated,
        summary=cap.summary,
        summary_text=summaries.render(cap.summary),
        notes=list(cap.notes or []),
        error=cap.error,
        created_at=cap.created_at,
        started_at=cap.started_at,
        finished_at=cap.finished_at,
    )
