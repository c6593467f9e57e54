"""docs/results/ commands in tests (tests/docs/test_results_*.py): one command per bench
script runs at its smallest size, writing into a temporary directory, never over
bench/results/ (:func:`small`, :func:`run`); every other one is parsed by its script's
parser (:func:`parse`)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

from bench import e2e
from tests.helpers import ROOT

BIN = Path(sys.executable).parent


def small(block: str, tmp: Path, **options: str | None) -> str:
    """The block with each ``--option`` set to a small value (appended when absent; None:
    a flag), and every ``--out NAME`` moved into ``tmp``."""
    lines = []
    for line in block.strip().splitlines():
        if "bench/" in line or "pytest" in line:
            for name, value in options.items():
                opt = "--" + name.replace("_", "-")
                if value is None:
                    if opt not in line.split():
                        line += f" {opt}"
                    continue
                pattern = re.compile(rf"{re.escape(opt)} ('[^']*'|\S+)")
                if pattern.search(line):
                    line = pattern.sub(f"{opt} {value}", line)
                else:
                    line += f" {opt} {value}"
            line = re.sub(r"--out (\S+)", lambda m: f"--out {tmp / m.group(1)}", line)
        lines.append(line.replace(".venv/bin/", f"{BIN}/"))
    return "\n".join(lines)


def run(script: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert res.returncode == 0, f"{script}\n{res.stderr[-4000:]}"
    return res


# bench/e2e.py at its smallest: the command runs and writes its results, nothing more
E2E_SMALL = {
    "small": None,
    # with a final check of 2 runs a session needs at least 7 runs of 2 s
    # (app/sessions/plan.py check_session_budget): 14 s
    "final_check_runs": "2",
    "budget_s": "16",
    "duration": "2",
    "warmup": "1",
    "rounds": "1",
    "confirm_duration": "2",
    "confirm_warmup": "1",
}


class _Parsed(BaseException):
    """Raised by the patched ``parse_args``: the script's main() stops right there."""

    def __init__(self, namespace: argparse.Namespace) -> None:
        super().__init__()
        self.namespace = namespace


def script_of(line: str) -> tuple[str, list[str]]:
    """A results-page command line's bench script (``bench/x.py``) and its arguments."""
    argv = shlex.split(line)
    (script,) = [w for w in argv if w.startswith("bench/") and w.endswith(".py")]
    return script, argv[argv.index(script) + 1 :]


def parse(line: str) -> tuple[str, argparse.Namespace]:
    """One results-page command line parsed by its script's own argparse parser, as the
    script's main() builds it, and nothing run (the rule for every command but the one per
    script that runs small: tests/docs/test_results_parse.py). bench/e2e.py's and
    bench/search_order.py's commands also pass the checks e2e.py makes on its arguments
    before it runs anything (run from a temporary directory: they make --out's folder).

    An unknown option, a bad value or a missing argument fails with argparse's message."""
    script, given = script_of(line)
    module = importlib.import_module(script.removesuffix(".py").replace("/", "."))
    real = argparse.ArgumentParser.parse_args

    def parse_only(
        self: argparse.ArgumentParser, args: Any = None, namespace: Any = None
    ) -> argparse.Namespace:
        parsed: argparse.Namespace = real(self, given, namespace)
        if script in ("bench/e2e.py", "bench/search_order.py"):
            return parsed  # e2e.parse_args's checks follow, then it returns
        raise _Parsed(parsed)

    err = io.StringIO()
    try:
        with (
            mock.patch.object(argparse.ArgumentParser, "parse_args", parse_only),
            contextlib.redirect_stderr(err),
        ):
            if script in ("bench/e2e.py", "bench/search_order.py"):
                return script, e2e.parse_args(e2e.parser())
            module.main()
    except _Parsed as done:
        return script, done.namespace
    except SystemExit as exit_:
        said = err.getvalue().strip().splitlines() or ["(nothing said)"]
        raise AssertionError(f"{script} refuses {given}: {said[-1]}") from exit_
    raise AssertionError(f"{script}'s main() never parsed its arguments")
