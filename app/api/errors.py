"""ServiceError as an HTTP response: the service's message, plus the REST call that fixes it.

Services say what to change in the domain's words (app/errors.py); only this layer knows
the paths, so only it names them.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse

from app.errors import ServiceError


def rest_hint(exc: ServiceError) -> str | None:
    """The request that fixes ``exc``, as a REST call, if it names one."""
    if exc.fix == "list-targets":
        return "GET /api/v1/targets lists them"
    if exc.fix == "list-sessions":
        return "GET /api/v1/sessions lists them"
    if exc.fix == "list-sweeps":
        return "GET /api/v1/sweeps lists them"
    if exc.fix == "list-captures":
        return "GET /api/v1/captures lists them"
    if exc.fix == "list-comparisons":
        return "GET /api/v1/comparisons lists them"
    if exc.fix == "import-capture":
        return (
            "or capture the log on the server yourself and upload it: "
            "POST /api/v1/captures/import?name=NAME&database=DB with the log as the body"
        )
    if exc.fix == "register-target":
        return "POST /api/v1/targets registers one"
    if exc.fix == "delete-target-history":
        tid = exc.about.get("target_id", "{id}")
        return f"DELETE /api/v1/targets/{tid}?history=keep or ?history=drop"
    return None


def detail(exc: ServiceError) -> str:
    hint = rest_hint(exc)
    return f"{exc.message}; {hint}" if hint else exc.message


def service_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    return JSONResponse(status_code=exc.status, content={"detail": detail(exc)})
