"""Running docs/results/ commands at small sizes (tests/docs/test_results_*.py): each
command writes into a temporary directory, never over bench/results/."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.docs.blocks import command
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
    # (app/tuning.py check_session_budget): 14 s
    "final_check_runs": "2",
    "budget_s": "16",
    "duration": "2",
    "warmup": "1",
    "rounds": "1",
    "confirm_duration": "2",
    "confirm_warmup": "1",
}


def run_e2e(name: str, out: str, tmp: Path, **options: str) -> dict[str, Any]:
    """One docs/results/ bench/e2e.py command, small; its JSON names the workloads.
    ``options``: more of them set small (e.g. one of the command's workloads), or set
    otherwise than E2E_SMALL does."""
    run(small(command(name), tmp, **{**E2E_SMALL, **options}), timeout=900)
    doc: dict[str, Any] = json.loads((tmp / out).read_text())
    assert doc["workloads"], name
    return doc
