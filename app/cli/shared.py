"""What every command shares: errors and exit statuses, the REST API client (a --server
or the in-process service), output helpers and the options many commands take."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeAlias

import httpx

from app.postgres.cgroups import PROFILES
from app.workloads import kinds
from optimizer.objective import OBJECTIVE_KINDS


class CliError(Exception):
    """One line for the user, saying what to do; printed without a traceback (exit 1)."""


class UsageError(CliError):
    """Options that do not go together: a usage error like argparse's own (exit 2)."""


# Exit statuses (docs/cli.md has the table). A finished session's comes from its outcome
# (app/sessions/summary.py: outcome(), the API's SessionOut.outcome), so a script reads
# the same answer as the API's clients.
EXIT_OK = 0  # done; for a session: a better config, confirmed by the final check
EXIT_ERROR = 1  # the command could not do what was asked (the message says why)
EXIT_USAGE = 2  # a usage error: argparse's, or options that do not go together
EXIT_NO_CHANGE = 3  # the session finished and recommends no change
EXIT_UNCONFIRMED = 4  # the session finished with a gain its final check did not confirm
EXIT_FAILED = 5  # the session (or sweep, capture) ran and failed; the target was restored
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM, or the session was cancelled
EXIT_BY_OUTCOME = {
    "confirmed": EXIT_OK,
    "no-change": EXIT_NO_CHANGE,
    "unconfirmed": EXIT_UNCONFIRMED,
    "failed": EXIT_FAILED,
    "cancelled": EXIT_INTERRUPTED,
}


# -- API access --------------------------------------------------------------------
class Api:
    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    def call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self.client.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach the knobtune service: {exc}") from exc
        if r.status_code == 422 and _invalid_body(r):
            # the request's own values are refused (not the target's state): the options'
            # fault, a usage error in the API's words
            raise UsageError(error_detail(r))
        if r.status_code >= 400:
            raise CliError(error_detail(r))
        if r.headers.get("content-type", "").startswith("application/json"):
            return r.json()
        return r.text


def _invalid_body(r: httpx.Response) -> bool:
    """A 422 of request validation: FastAPI's list of field errors."""
    try:
        return isinstance(r.json().get("detail"), list)
    except (ValueError, AttributeError):
        return False


def error_detail(r: httpx.Response) -> str:
    try:
        detail = r.json().get("detail")
    except ValueError:
        return f"HTTP {r.status_code}: {r.text[:300]}"
    if isinstance(detail, list):  # pydantic validation errors
        parts = []
        for d in detail:
            loc = ".".join(str(x) for x in d.get("loc", [])[1:])
            parts.append(f"{loc}: {d.get('msg')}" if loc else str(d.get("msg")))
        return "; ".join(parts)
    return str(detail)


@contextlib.contextmanager
def connect(
    server: str | None,
    token: str | None,
    *,
    database_url: str | None = None,
    work_dir: Path | None = None,
    run_scheduler: bool = True,
    restart_methods: dict[str, Any] | None = None,
) -> Iterator[Api]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if server:
        with httpx.Client(base_url=server.rstrip("/"), headers=headers, timeout=60) as client:
            yield Api(client)
        return
    with warnings.catch_warnings():
        # Starlette nudges toward another HTTP client package; irrelevant to users here.
        warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
        from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings

    # The operator acting on their own machine: targets may be its local servers, and a
    # DSN target's workload may run as the DSN's user (app/postgres/connect.py, roles.py).
    overrides: dict[str, Any] = {"local_operator": True}
    if database_url:
        overrides["database_url"] = database_url
    if work_dir:
        overrides["work_dir"] = work_dir
    if not run_scheduler:
        overrides["run_scheduler"] = False  # read-only commands must not start sessions
    if restart_methods:
        # The CLI is the operator of its in-process service: it may declare methods (argv,
        # never a shell), besides those of KNOBTUNE_RESTART_METHODS.
        base = Settings(**overrides).restart_methods
        overrides["restart_methods"] = {**base, **restart_methods}
    settings = Settings(**overrides)
    token = token or (settings.api_token.get_secret_value() if settings.api_token else None)
    if token:
        headers = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(settings), headers=headers, raise_server_exceptions=False) as client:
        yield Api(client)


# -- reading and writing ------------------------------------------------------------
def existing_metadata_db(args: argparse.Namespace, missing: str = "") -> str:
    """The in-process metadata DB a command reads; it must exist already.

    Says which DB it is (a bare listing from the wrong directory looked empty) and never
    creates one: SQLite would silently make a new, empty file.
    """
    from sqlalchemy.engine import make_url

    from app.settings import absolute_sqlite_url, get_settings

    url = absolute_sqlite_url(args.database_url or get_settings().database_url)
    parsed = make_url(url)
    shown = parsed.render_as_string(hide_password=True)
    db = parsed.database or ""
    if parsed.drivername.startswith("sqlite") and db != ":memory:" and not Path(db).exists():
        raise CliError(
            f"{missing}no metadata DB at {db} (from KNOBTUNE_DATABASE_URL or its default "
            "sqlite:///knobtune.db, relative to the current directory); give --server URL of "
            "a running service, --database-url of the service's DB, or run this where the "
            "service ran"
        )
    print(f"metadata DB: {shown}", file=sys.stderr)
    return url


@contextlib.contextmanager
def reader(args: argparse.Namespace, missing: str = "") -> Iterator[Api]:
    """The API for a command that needs an existing metadata DB and runs no session."""
    url = None if args.server else existing_metadata_db(args, missing)
    with connect(args.server, args.token, database_url=url, run_scheduler=False) as api:
        yield api


def read_script(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise CliError(f"cannot read the script {path}: {exc.strerror or exc}") from None


def out_dir(args: argparse.Namespace) -> Path | None:
    """``--out DIR`` checked before anything runs (None: no file is written)."""
    from app.outfiles import OutputRefused, check_dir

    if args.out is None:
        return None
    try:
        check_dir(Path(args.out), force=args.force)
    except OutputRefused as exc:
        raise CliError(f"--out: {exc}") from None
    return Path(args.out).expanduser()


def write_text(path: Path, text: str, *, force: bool, mode: int = 0o644) -> None:
    from app.outfiles import OutputRefused, write_file

    try:
        write_file(path, text.encode(), mode=mode, force=force)
    except OutputRefused as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None


def print_json(doc: Any) -> None:
    """--json: the API's response as it came (passwords masked by the API)."""
    print(json.dumps(doc, indent=2))


def fail(exc: BaseException) -> None:
    # One line, whatever the driver said: newlines and tabs from libpq folded.
    print(f"knobtune: {' '.join(str(exc).split())}", file=sys.stderr)


# -- the parser's pieces -------------------------------------------------------------
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Handler: TypeAlias = Callable[[argparse.Namespace], int]


# The choices of a workload and a search that tune and compare both take
BUILTINS = list(kinds.ALL_BUILTINS)  # every builtin kind (app/workloads/kinds.py)
PGBENCH_BUILTINS = list(kinds.PGBENCH_BUILTINS)  # pgbench's own: what a sweep runs
OBJECTIVES = list(OBJECTIVE_KINDS)
WORKLOAD_KINDS = ["write-heavy", "read-heavy", "mixed", "analytics"]
ISOLATION_LEVELS = ["read committed", "repeatable read", "serializable"]


class Help(argparse.HelpFormatter):
    """Each option's default after its help text, unless there is none to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            "%(default)" in text
            or "default" in text
            or not action.option_strings
            or action.default in (None, False, argparse.SUPPRESS)
            or isinstance(action, argparse.BooleanOptionalAction)
        ):
            return text
        return text + " (default: %(default)s)"


def add_command(sub: Subparsers, name: str, text: str, func: Handler) -> argparse.ArgumentParser:
    """A command: ``text`` is both its line in ``knobtune --help`` and its description."""
    sp = sub.add_parser(name, help=text, description=text, formatter_class=Help)
    sp.set_defaults(func=func)
    return sp


def add_action(sub: Subparsers, name: str, text: str, func: Handler) -> argparse.ArgumentParser:
    """An action of a command (``targets add``, ``captures list``): ``text`` is its help."""
    sp = sub.add_parser(name, help=text, formatter_class=Help)
    sp.set_defaults(func=func)
    return sp


def add_remote(sp: argparse.ArgumentParser) -> None:
    """Where the REST API is: --server, else the in-process service on --database-url."""
    sp.add_argument(
        "--server",
        metavar="URL",
        help="a running knobtune service, e.g. http://127.0.0.1:8000 (default: run "
        "in-process on the metadata DB of the current directory)",
    )
    sp.add_argument(
        "--token",
        default=os.environ.get("KNOBTUNE_API_TOKEN"),
        help="the service's API token (default: $KNOBTUNE_API_TOKEN)",
    )
    sp.add_argument(
        "--database-url",
        metavar="URL",
        help="in-process: the metadata DB (default: $KNOBTUNE_DATABASE_URL, else "
        "sqlite:///knobtune.db in the current directory)",
    )


def add_json(sp: argparse.ArgumentParser, default: Any = False) -> None:
    sp.add_argument(
        "--json",
        action="store_true",
        default=default,
        help="print the REST API's response as JSON (the same fields, passwords masked)",
    )


def add_out_options(sp: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    sp.add_argument(
        "--out",
        metavar="DIR",
        help="write the session's files there: knobtune-session-N.conf (the config), .svg "
        "(the chart) and .json (its record); never into a data directory (default: no "
        "file)",
    )
    sp.add_argument(
        "--force",
        action="store_true",
        help="replace those files if they exist; write into a directory holding a "
        "postgresql.conf (default: refuse both)",
    )


def add_server_facts(sp: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    sp.add_argument(
        "--ram-gib",
        type=float,
        metavar="GIB",
        help="the server's memory in GiB; needed when it is on another host (default: "
        "read from this host, or less where the server's cgroup limits it)",
    )
    sp.add_argument(
        "--cpus",
        type=int,
        metavar="N",
        help="the server's CPUs; needed when it is on another host (default: this host's)",
    )


def add_warmup(sp: argparse.ArgumentParser) -> None:
    """--warmup of the short-run commands (demo, sweep)."""
    sp.add_argument(
        "--warmup",
        type=int,
        default=2,
        metavar="SECONDS",
        help="seconds at the start of each run that are not measured",
    )


def add_profile(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--profile",
        choices=list(PROFILES),
        help="a new sandbox's hardware profile (a cgroup caps its memory, disk and "
        "CPUs like a small server's; docs/profiles.md): "
        + "; ".join(f"{n}: {p.limits.figures()}" for n, p in PROFILES.items()),
    )


def clients_arg(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number or 'auto', not {text!r}") from None


def duration(text: str) -> float:
    """Seconds from "900", "900s", "15m", "2h"."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min|h)?\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(f"a duration like 900, 15m or 2h, not {text!r}")
    return float(m.group(1)) * {None: 1, "s": 1, "m": 60, "min": 60, "h": 3600}[m.group(2)]
