"""The ``knobtune`` command line.

Every command talks to the REST API: to a running service (``--server``) or to
the same app run in-process (FastAPI's ASGI client starts it with its
scheduler), so the CLI and the service share one code path.

Each command's module declares its arguments (``register``) beside its handler;
this one builds the parser from them, in the order ``knobtune --help`` lists them,
and runs the command with its exit status (app/cli/shared.py).
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from app.cli import apply, captures, compare, demo, serve, sessions, sweeps, targets
from app.cli.shared import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CliError,
    Help,
    UsageError,
    fail,
)

COMMANDS = (serve, demo, targets, sessions, apply, captures, sweeps, compare)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="knobtune",
        description="Tune PostgreSQL knobs by noise-aware coordinate descent. "
        "The flow: targets add, tune, status, apply (and rollback).",
        formatter_class=Help,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return p


def _terminate(_sig: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def unwind_on_sigterm() -> None:
    """SIGTERM (kill, timeout, systemd) unwinds like Ctrl-C from here on, so that
    with-blocks clean up: a demo's or a bench script's sandbox is removed, never orphaned
    (Python's default SIGTERM ends the process without running them). The live view
    installs its own handler while it runs."""
    signal.signal(signal.SIGTERM, _terminate)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    unwind_on_sigterm()
    try:
        return int(args.func(args))
    except CliError as exc:
        fail(exc)
        return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_ERROR
    except KeyboardInterrupt:
        print("knobtune: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        # Errors a user can cause arrive as our own types; anything else still
        # gets one line (the service logs have the details).
        from app.postgres.sandbox import PostgresNotInstalled

        if isinstance(exc, PostgresNotInstalled | FileNotFoundError | PermissionError):
            fail(exc)
            return EXIT_ERROR
        raise
