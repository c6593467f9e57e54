"""optimizer stays pure: no service dependencies, only stdlib, numpy and scipy."""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import optimizer

PKG = Path(optimizer.__file__).resolve().parent


def submodules() -> list[str]:
    return [f"optimizer.{m.name}" for m in pkgutil.iter_modules([str(PKG)])]


def test_importing_optimizer_loads_no_service_modules() -> None:
    mods = ["optimizer", *submodules()]
    assert {"optimizer.knobs", "optimizer.descent", "optimizer.replay"} <= set(mods)
    code = (
        "import importlib, json, sys\n"
        f"for m in {mods!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
        cwd=PKG.parent,
    )  # fmt: skip
    loaded = json.loads(out.stdout)
    banned = ("fastapi", "sqlalchemy", "psycopg", "app", "pydantic", "starlette", "optuna")
    bad = [m for m in loaded if m.split(".")[0] in banned]
    assert bad == []


def test_only_stdlib_numpy_scipy_imports() -> None:
    allowed = set(sys.stdlib_module_names) | {"numpy", "scipy", "optimizer"}
    for path in PKG.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"


def test_no_io_or_environment_outside_replay() -> None:
    for path in PKG.glob("*.py"):
        if path.name == "replay.py":
            continue
        text = path.read_text()
        for needle in ("open(", "os.environ", "getenv", "print(", "sys.stdin", "time.time"):
            assert needle not in text, f"{path.name} uses {needle}"
