"""A bench script stopped with SIGTERM (``kill``, ``timeout``) removes its sandbox, as
Ctrl-C does (bench/common.py run_main): Python's default SIGTERM ended the process
without running the ``with`` blocks, and the sandbox's server ran on for good."""

from __future__ import annotations

import contextlib
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
    import faulthandler, signal, sys, time
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's dump on a hang
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


# Sandbox.destroy's own bound: pg_ctl stop fast (30 s), then immediate (30 s), the cgroup (5 s).
_UNWIND_S = 150


def _wait_or_explain(proc: subprocess.Popen[str], root: Path, pid: int) -> tuple[str, str]:
    """The script's output once it exits; if it outlives its own bounds, a failure that says
    where it hung: its Python stack (faulthandler), its process tree, the server's log."""
    try:
        return proc.communicate(timeout=_UNWIND_S)
    except subprocess.TimeoutExpired:
        tree = subprocess.run(
            [
                "ps",
                "--deselect",
                "-p",
                "2",
                "--ppid",
                "2",
                "--forest",
                "-o",
                "pid,ppid,stat,etime,args",
            ],
            capture_output=True,
            text=True,
        ).stdout
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1)
        proc.kill()
        _out, err = proc.communicate()
        log = root / "server.log"
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no server.log)"
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGQUIT)  # the postmaster's immediate shutdown: leave none behind
        raise AssertionError(
            f"still running {_UNWIND_S} s after SIGTERM\n{err}\n{tree}\n{tail}"
        ) from None


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
    _out, err = _wait_or_explain(proc, root, pid)
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
