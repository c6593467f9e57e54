"""Issue 25, privilege: a root service runs nothing of a client's as root.

pgbench (a client's scripts run inside it) and the restart methods run as the
unprivileged KNOBTUNE_RUN_AS_USER (default nobody), never as postgres (peer auth would
make them the host PostgreSQL's superuser), with none of the service's environment.
The uid is read from /proc for the real pgbench child.
"""

from __future__ import annotations

import os
import pwd
import tempfile
from pathlib import Path

import pytest

from app.postgres.pgbench import BenchSpec, ProgressSample, run_bench
from app.postgres.sandbox import Sandbox

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only a root service drops privileges")

TOKEN = "service-token-that-children-must-not-see"


def _children_named(name: str) -> list[int]:
    """pids of this process's children whose command is ``name``."""
    me, out = os.getpid(), []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            comm = (d / "comm").read_text().strip()
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if comm == name and ppid == me:
            out.append(int(d.name))
    return out


def _uid(pid: int) -> int:
    for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])  # the real uid
    raise AssertionError(f"no Uid line for {pid}")


def test_pgbench_runs_unprivileged_without_the_services_environment(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KNOBTUNE_API_TOKEN", TOKEN)
    seen: dict[int, tuple[int, bytes]] = {}

    def watch(_sample: ProgressSample) -> None:
        for pid in _children_named("pgbench"):
            try:
                environ = (Path("/proc") / str(pid) / "environ").read_bytes()
                seen[pid] = (_uid(pid), environ)
            except OSError:
                pass

    res = run_bench(
        sandbox.dsn,
        BenchSpec(
            builtin=None,
            scripts=[("SELECT pg_sleep(0.01);", 1)],
            clients=1,
            jobs=1,
            duration_s=3,
            warmup_s=0,
        ),
        workdir=tmp_path,  # private to root: pgbench gets a directory of its own
        watch=watch,
    )
    assert res.ok, res.error
    assert seen, "no pgbench child was seen"
    nobody = pwd.getpwnam("nobody").pw_uid
    postgres = pwd.getpwnam("postgres").pw_uid
    for pid, (uid, environ) in seen.items():
        assert uid == nobody, f"pgbench {pid} ran as uid {uid}"
        assert uid not in (0, postgres)
        assert TOKEN.encode() not in environ
        assert b"KNOBTUNE_" not in environ


def test_a_command_restart_method_runs_as_the_unprivileged_user() -> None:
    from app.postgres.restart import CommandMethod
    from app.postgres.restart import run as run_restart

    out = Path(tempfile.mkdtemp(prefix="knobtune-idtest-"))
    out.chmod(0o777)
    try:
        method = CommandMethod.model_validate(
            {"kind": "command", "argv": ["sh", "-c", 'id -u > "$0"', str(out / "uid")]}
        )
        run_restart(method)
        assert int((out / "uid").read_text()) == pwd.getpwnam("nobody").pw_uid
        as_postgres = CommandMethod.model_validate(
            {
                "kind": "command",
                "argv": ["sh", "-c", 'id -u > "$0"', str(out / "uid2")],
                "user": "postgres",
            }
        )
        run_restart(as_postgres)  # the operator may name a user: theirs to choose
        assert int((out / "uid2").read_text()) == pwd.getpwnam("postgres").pw_uid
    finally:
        for p in out.iterdir():
            p.unlink()
        out.rmdir()
