"""README's first command on a fresh machine: the setup and the demo in a fresh copy of
the repository (its own virtualenv), then `knobtune` from anywhere once activated. A
module of its own: an install takes minutes, and the suite hands out whole modules.

The manual shows the same demo command twice more (docs/getting-started.md and the demo's
results page): the test checks they are README's command, word for word, so that this one
run is theirs too, instead of running the demo three times."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.acceptance.conftest import user_env
from tests.docs.blocks import command, replace
from tests.helpers import ROOT

# 11 runs: the fewest a session with the default final check (6 runs) may plan, its
# baseline (2) and one evaluation (3); the demo's default is 14. 2 s runs (1 s measured):
# what is asserted is what the demo writes and says, not what a run measured; one client:
# half the CPU of two, and the path is the same
SMALL = "--duration 2 --warmup 1 --scale 1 --clients 1 --max-trials 11"


@pytest.mark.slow
@pytest.mark.timeout(1800)  # an install into a new virtualenv; minutes on a loaded host
def test_setup_and_demo_from_a_fresh_copy(tmp_path: Path) -> None:
    """`bash .ci/bootstrap && .venv/bin/knobtune demo --out demo` in a fresh copy of the
    tracked files (its own virtualenv), then `knobtune` from another directory once
    activated."""
    readme = command("demo")
    assert command("setup-demo") == readme  # docs/getting-started.md shows README's command
    setup, demo = readme.strip().split(" && ")
    assert setup == "bash .ci/bootstrap"
    assert command("results-demo").strip() == demo  # docs/results/demo.md: its second half

    copy = Path(tempfile.mkdtemp(prefix="knobtune-clone-"))
    copy.chmod(0o755)
    try:
        files = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout.decode()
        for name in filter(None, files.split("\0")):
            src = ROOT / name
            if src.is_file():
                (copy / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, copy / name)
        small = replace(readme, "--out demo", f"{SMALL} --out demo")
        env = {"PYTHON": str(Path(sys.base_prefix) / "bin" / "python3")}
        res = subprocess.run(
            ["bash", "-e", "-c", small],
            cwd=copy,
            env=user_env(**env),
            capture_output=True,
            text=True,
            timeout=1500,
        )
        out = copy / "demo"
        # the exit status is the session's outcome (docs/cli.md), the record's
        record = json.loads((out / "knobtune-session-1.json").read_text())
        codes = {"confirmed": 0, "no-change": 3, "unconfirmed": 4}
        assert res.returncode == codes.get(record["outcome"]), res.stderr[-4000:]
        conf = (out / "knobtune-session-1.conf").read_text()
        assert conf.startswith("# knobtune recommendation")
        assert "work_mem" in conf
        assert "config: demo/knobtune-session-1.conf" in res.stdout
        # one progress line per trial when not on a terminal, and the chart has them all
        trials = re.findall(r"^trial +\d+ ", res.stderr, flags=re.M)
        n = len(trials)
        assert 5 <= n <= 11
        # the planned total is re-estimated as the session goes: never behind the trials done
        progress = [tuple(map(int, m)) for m in re.findall(r"\[(\d+)/(\d+) trials", res.stderr)]
        assert len(progress) == n
        assert all(done <= planned for done, planned in progress), progress
        assert progress[-1][1] == n
        assert (out / "knobtune-session-1.svg").read_text().count('class="trial"') == n
        # the sandbox is gone, and nothing but the output is left in the directory
        sandbox_dir = re.search(r"sandbox at (\S+)", res.stderr)
        assert sandbox_dir is not None
        assert not Path(sandbox_dir.group(1)).exists()
        assert not (copy / "knobtune.db").exists()

        # the setup again on a set-up copy: idempotent, and quick
        res = subprocess.run(["bash", "-e", "-c", setup], cwd=copy, env=user_env(**env),
                             capture_output=True, text=True, timeout=900)  # fmt: skip
        assert res.returncode == 0, res.stderr[-4000:]

        # README and the manual: activate, then `knobtune` works from any directory
        for name in ("activate", "activate-anywhere"):
            res = subprocess.run(
                ["bash", "-e", "-c", command(name)],
                cwd=copy,
                env=user_env(),
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert res.returncode == 0, res.stderr
            assert "usage: knobtune" in res.stdout
    finally:
        shutil.rmtree(copy, ignore_errors=True)
