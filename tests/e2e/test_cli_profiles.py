"""Hardware profiles from the command line: `targets add --profile`, `demo --profile`."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
from pathlib import Path

from app.postgres import cgroups
from app.postgres.cgroups import Cgroup
from tests.acceptance.conftest import BIN, user_env
from tests.docs.blocks import command, replace
from tests.e2e.test_cli import CLI, _wait_for_line, run
from tests.helpers import needs_cgroups

pytestmark = needs_cgroups


def _ours() -> set[str]:
    return {
        p.name
        for c in ("memory", "blkio", "cpu")
        for p in (cgroups.CGROUP_ROOT / c).glob("knobtune-*")
    }


def test_targets_add_with_a_profile_and_remove(tmp_path: Path) -> None:
    """docs/profiles.md's `targets add --profile` block, in a fresh directory (the default
    in-process service), with the smaller profile."""
    before = _ours()
    block = replace(command("profiles-add"), "--profile small", "--profile micro")
    env = user_env(PATH=f"{BIN}:{os.environ['PATH']}", KNOBTUNE_RUN_SCHEDULER="false")
    res = subprocess.run(
        ["bash", "-e", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=180,
    )  # fmt: skip
    try:
        assert res.returncode == 0, res.stderr
        assert "target vm-small registered" in res.stdout
        assert "cgroup limits: 0.50 GiB of memory and 1 CPU(s)" in res.stdout
        # its cgroup, kept while the target lives, named after it (other tests' sandboxes
        # come and go meanwhile: one made since `before` once counted as a second)
        mine = {name for name in _ours() - before if name.startswith("knobtune-vm-small-")}
        assert len(mine) == 1, _ours() - before
    finally:
        # (this command's service starts the sandbox again, in its cgroup, then removes it)
        gone = subprocess.run(
            ["bash", "-e", "-c", "knobtune targets remove vm-small"], cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    assert gone.returncode == 0, gone.stderr
    assert not mine & _ours()

    both = run("targets", "add", "x", "--dsn", "host=/nowhere", "--sandbox", cwd=tmp_path)
    assert both.returncode == 2
    assert "give --dsn DSN (a server of yours) or --sandbox" in both.stderr


def test_demo_with_a_profile_runs_in_its_cgroup_and_removes_it(tmp_path: Path) -> None:
    # docs/profiles.md's demo block, on the smaller profile, at a small size, interrupted
    block = replace(
        command("profiles-demo"),
        "--profile small",
        f"--profile micro --out {tmp_path / 'out'} --duration 30 --scale 1 --clients 1",
    )
    argv = shlex.split(block)
    assert argv[0] == "knobtune"
    # started with SIGINT ignored, as under a parent that ignores it (a test worker, nohup):
    # the demo's own handler must be in place by the time it says "session N", or the
    # Ctrl-C below is lost and the session runs to its end (seen once on a full run)
    proc = subprocess.Popen(
        ["bash", "-c", 'trap "" INT; exec "$@"', "-", *CLI, *argv[1:]], cwd=tmp_path,
        stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        seen = _wait_for_line(proc, r"sandbox at ", 60)
        assert "profile micro (512MB memory, 1 CPU, 500 IOPS, 50 MB/s)" in seen
        root = re.search(r"sandbox at (\S+) ", seen)
        assert root is not None
        _wait_for_line(proc, r"session \d+", 60)
        # the postmaster and the backends pgbench uses are in the demo sandbox's cgroup
        cg = Cgroup.for_sandbox(Path(root.group(1)))
        mem = cgroups.CGROUP_ROOT / "memory" / cg.name
        assert int((mem / "memory.limit_in_bytes").read_text()) == 512 * 2**20
        assert len(cg.pids()) >= 3
        proc.send_signal(signal.SIGINT)
        # a hang guard, not a speed target: about 10 s alone, over 90 s once on a host
        # busy with four test workers (the cancel waits for the run in flight to stop and
        # the target's restore, on a 500-IOPS, 1-CPU sandbox)
        _out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert not Path(root.group(1)).exists()
    assert not cg.dirs()  # its cgroup is gone (other tests' may come and go meanwhile)
