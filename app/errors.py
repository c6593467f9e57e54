"""Errors a user can fix, shared by every domain; depends on nothing in app/.

A service raises :class:`ServiceError` with an HTTP status and a message that says what
to change, in the domain's words. Where the fix is another request (list the targets,
register one, delete with a history choice), ``fix`` names it without naming a REST
path: the API layer (app/api/errors.py) turns it into one, the dashboard and the CLI say
it their own way. :func:`errors_text` says a refused request body (a pydantic
ValidationError) in one line, without the input it refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

# What would fix the error, as an action on a domain; the API adds its path.
Fix = Literal[
    "list-targets",
    "list-sessions",
    "list-sweeps",
    "list-captures",
    "list-comparisons",
    "import-capture",
    "register-target",
    "delete-target-history",
]


@dataclass
class ServiceError(Exception):
    """An error the user can fix: an HTTP status and a message that says what to change."""

    status: int
    message: str
    fix: Fix | None = None
    # what the fix is about (e.g. the target's id for "delete-target-history")
    about: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message


class RequestError(ValueError):
    """A request (a session's, a comparison's) that cannot run as given; the message says
    what to change."""


_ID_MAX = 2**63 - 1  # the metadata DB's integers are 64-bit at most


def to_id(n: int) -> int:
    """An id as a query parameter; one no 64-bit column can hold matches nothing (0).

    SQLite's driver raises on Python ints beyond 64 bits: looking one up must be
    "not found", not a server error.
    """
    return n if -_ID_MAX - 1 <= n <= _ID_MAX else 0


def errors_text(exc: ValidationError, *, drop: int = 0) -> str:
    """``exc`` as one line, "where: what" per error, without the input it refused.

    pydantic's own text and ``exc.errors()`` carry the input: a DSN's password, or a
    body of many megabytes. ``drop`` leading parts of each location are left out
    (e.g. 1 for FastAPI's "body").
    """
    parts = []
    for err in exc.errors(include_input=False, include_url=False, include_context=False):
        loc = ".".join(str(x) for x in err["loc"][drop:])
        msg = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)
