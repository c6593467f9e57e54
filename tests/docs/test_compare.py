"""docs/compare.md's commands, run from their blocks at small sizes in a fresh directory:
register a server with a restart method, compare default and pgtune (a restart each way),
then current against a file's settings with --json. Asserted: the CLI's table and exit
status, the JSON's fields, the server's settings afterwards; never which config won."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.postgres.sandbox import Sandbox
from tests.docs.blocks import command, replace
from tests.docs.shell import bash
from tests.helpers import file_settings

# pgbench at 100 tps (-R): the test asserts the table, the JSON and the settings, never a
# level, and an unthrottled run keeps a CPU busy that the suite's other workers wait for
SMALL = (
    "--rounds 2 --duration-s 2 --warmup 0 --warmup-run-s 1 --scale 1 --clients 2 --jobs 1 "
    "--rate 100"
)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_compare_commands(user_dir: Path, staging: Sandbox) -> None:
    # the operator's restart method for this server: the sandbox's own pg_ctl
    method = json.dumps({"local": staging.restart_method.model_dump(by_alias=True)})
    register = replace(
        command("compare-register"),
        """'{"local": {"kind": "pg_ctl", "data_dir": "/var/lib/postgresql/15/main"}}'""",
        f"'{method}'",
    )
    register = replace(
        register,
        'export DSN="host=db5.example.com user=postgres dbname=shop"',
        f'export DSN="{staging.dsn}"',
    )
    # pgtune for 1 GiB: 256MB of shared_buffers, not 16 GiB's 4GB on a shared test host
    register = replace(register, "--ram-gib 16 --cpus 4", "--ram-gib 1 --cpus 1")
    res = bash(register, user_dir, 600)
    assert res.returncode == 0, res.stderr[-3000:]
    before = file_settings(staging.dsn)
    env = {"KNOBTUNE_RESTART_METHODS": method}

    run = replace(command("compare-run"), "--rounds 4 --duration-s 60", SMALL)
    res = bash(run, user_dir, 800, **env)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "comparison 1 started on staging" in res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("comparison 1 on staging: succeeded; 2 rounds of 2 configs")
    assert lines[1].split()[:3] == ["config", "tps", "(median)"]
    assert lines[2].split()[0] == "default"
    assert lines[2].endswith("reference")
    assert lines[3].startswith("pgtune")
    assert "throughput " in lines[3]
    assert "p=" in lines[3] or "round" in lines[3] or "spread" in lines[3]
    assert "the target's settings were restored" in res.stdout
    assert file_settings(staging.dsn) == before

    small = replace(command("compare-file"), "--rounds 4 --duration-s 60", SMALL)
    res = bash(small, user_dir, 800, **env)
    assert res.returncode == 0, res.stderr[-4000:]
    # the file's other lines stay on the client
    assert "file:my.conf: left out, not knobs knobtune compares: listen_addresses" in res.stderr
    doc = json.loads((user_dir / "comparison.json").read_text())
    assert doc["status"] == "succeeded"
    assert doc["request"]["workload"]["rate"] == 100  # --rate: the runs' pgbench -R
    assert doc["reference"] == "current"
    assert [c["name"] for c in doc["configs"]] == ["current", "file:my.conf"]
    assert doc["configs"][1]["settings"] == {"work_mem": "64MB", "random_page_cost": "1.1"}
    mine = [r for r in doc["runs"] if r["config"] == "file:my.conf"]
    assert len(mine) == 2
    for r in mine:
        assert r["settings"]["work_mem"] == "64MB"
        assert r["settings"]["random_page_cost"] == "1.1"
    (gain,) = doc["gains"]
    assert {"gain", "ci95", "p_value", "rounds", "significant", "text"} <= set(gain)
    assert doc["restored"] is True
    assert file_settings(staging.dsn) == before
