"""docs/cli.md's reference: `knobtune COMMAND --help` of every command, as printed.

Regenerate after changing an option: ``.venv/bin/python -m tests.docs.cli_reference``
rewrites the part of docs/cli.md after its first reference heading;
tests/docs/test_site.py fails while the two differ.
"""

from __future__ import annotations

import os
import subprocess
import sys

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
    env = {**os.environ, "COLUMNS": "100"}
    res = subprocess.run(
        [sys.executable, "-m", "app.cli", *command.split(), "--help"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return res.stdout.rstrip()


def reference() -> str:
    return "\n".join(f"## knobtune {c}\n\n```text\n{help_text(c)}\n```\n" for c in COMMANDS)


def current() -> str:
    text = (ROOT / "docs" / "cli.md").read_text()
    return text[text.index(START) :]


if __name__ == "__main__":
    path = ROOT / "docs" / "cli.md"
    text = path.read_text()
    path.write_text(text[: text.index(START)] + reference() + "\n")
