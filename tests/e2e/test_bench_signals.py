"""A bench script stopped with SIGTERM (``kill``, ``timeout``) removes its sandbox, as
Ctrl-C does (bench/common.py run_main): Python's default SIGTERM ended the process
without running the ``with`` blocks, and the sandbox's server ran on for good."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, sys.argv[1])
    from app.postgres.sandbox import Sandbox
    from bench.common import run_main

    def main() -> int:
        with Sandbox.create() as sb:
            pid = (sb.data_dir / "postmaster.pid").read_text().split()[0]
            print(sb.root, pid, flush=True)
            time.sleep(120)
        return 0

    run_main(main)
    """
)


def test_sigterm_removes_the_bench_sandbox(tmp_path: Path) -> None:
    script = tmp_path / "bench_like.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(ROOT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert len(line) == 2, (line, proc.stderr.read() if proc.stderr else "")
    root, pid = Path(line[0]), int(line[1])
    assert root.is_dir()
    os.kill(pid, 0)  # the sandbox's server runs
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert not root.exists()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"the sandbox's postmaster {pid} still runs")
