"""The manual's REST walkthrough (docs/rest.md), run as a new user would run it.

The block marked ``rest-walkthrough`` is executed by bash as it stands, with these
substitutions only: a free port for 8000 (tests run side by side), the absolute path of
this virtualenv for `.venv/bin/` (the directory is fresh, not the checkout), and smaller
sizes (one client at 50 tps, pgbench -R; 2 s runs; 7 runs with a final check of 2): what
is asserted is what the session stores and the service writes, never a level. No
KNOBTUNE_* variable is set: the manual shows none, so the defaults are what is tested.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from app.postgres.sandbox import free_port
from tests.acceptance.conftest import BIN, user_env
from tests.docs.blocks import command, replace


def test_rest_walkthrough_in_a_fresh_directory(user_dir: Path) -> None:
    block = command("rest-walkthrough")
    port = free_port()
    script = block.replace("localhost:8000", f"localhost:{port}").replace(
        "--port 8000", f"--port {port}"
    )
    script = script.replace(".venv/bin/", f"{BIN}/")
    # small sizes (the block's session runs about two minutes on 4 unthrottled clients)
    script = replace(script, '"clients": 4, "jobs": 2,', '"clients": 1, "jobs": 1, "rate": 50,')
    script = replace(script, '"duration_s": 5, "warmup_s": 1}', '"duration_s": 2, "warmup_s": 1}')
    script = replace(script, '"max_trials": 12}', '"max_trials": 7, "final_check_runs": 2}')
    assert "8000" not in script
    assert f"{BIN}/knobtune serve" in script
    (user_dir / "walkthrough.sh").write_text(script + "\n")
    proc = subprocess.Popen(
        ["bash", "-e", "-o", "pipefail", "walkthrough.sh"],
        cwd=user_dir,
        env=user_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=540)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-4000:]

    # The session finished, through the final step, on the defaults.
    conf = (user_dir / "knobtune-session-1.conf").read_text()
    assert conf.startswith("# knobtune recommendation"), conf
    doc = json.loads((user_dir / "knobtune.json").read_text())
    assert doc["header"]["status"] == "succeeded", doc["header"]
    assert "work_mem" in doc["original"]
    assert (user_dir / "knobtune.sql").read_text().startswith("--")
    # curl prints no newline after a body: find the trials array in the output stream.
    start = out.index('[{"index":1,')
    trials, _ = json.JSONDecoder().raw_decode(out, start)
    assert [t["index"] for t in trials] == list(range(1, len(trials) + 1))
    assert trials[0]["role"] == "baseline"
    assert not any(t["error"] for t in trials)
    # Everything lives where README says: the directory the service started in.
    assert (user_dir / "knobtune.db").exists()
    assert (user_dir / ".knobtune").is_dir()
    assert not list((user_dir / ".knobtune" / "sandboxes").iterdir())  # removed by DELETE
