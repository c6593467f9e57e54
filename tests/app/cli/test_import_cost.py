"""The CLI starts without loading pydantic, psycopg or the service (it imports the
builtin workload kinds from app/workloads/kinds.py, so app/workloads/__init__.py must stay
cheap to import too)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HEAVY = ("pydantic", "psycopg", "fastapi", "sqlalchemy", "app.workloads.schemas")


def test_importing_the_cli_loads_nothing_heavy() -> None:
    code = f"import sys, app.cli\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == []
