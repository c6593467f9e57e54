"""docs/cli.md's reference: `knobtune COMMAND --help` of every command, as printed.

Regenerate after changing an option: ``.venv/bin/python -m tests.docs.cli_reference``
rewrites the part of docs/cli.md after its first reference heading;
tests/docs/test_site.py fails while the two differ.
"""

from __future__ import annotations

import contextlib
import io
import os
from unittest import mock

from app.cli import build_parser
from tests.helpers import ROOT

COMMANDS = [
    "targets add",
    "targets list",
    "targets remove",
    "tune",
    "status",
    "sessions",
    "export",
    "apply",
    "rollback",
    "cancel",
    "sweep",
    "compare",
    "capture",
    "captures list",
    "captures show",
    "captures import",
    "captures download",
    "captures delete",
    "demo",
    "serve",
    "db",
]
START = "## knobtune targets add"


def help_text(command: str) -> str:
    """What `knobtune COMMAND --help` prints at 100 columns: the CLI's own parser, in this
    process (a process per command took 23 s of a worker on a loaded run; the command's
    --help as a process: tests/e2e/test_cli.py)."""
    out = io.StringIO()
    with (
        mock.patch.dict(os.environ, {"COLUMNS": "100"}),  # argparse's width: the terminal's
        contextlib.redirect_stdout(out),
        contextlib.suppress(SystemExit),
    ):
        build_parser().parse_args([*command.split(), "--help"])
    return out.getvalue().rstrip()


def reference() -> str:
    return "\n".join(f"## knobtune {c}\n\n```text\n{help_text(c)}\n```\n" for c in COMMANDS)


def current() -> str:
    text = (ROOT / "docs" / "cli.md").read_text()
    return text[text.index(START) :]


if __name__ == "__main__":
    path = ROOT / "docs" / "cli.md"
    text = path.read_text()
    path.write_text(text[: text.index(START)] + reference() + "\n")
