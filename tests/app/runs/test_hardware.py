"""A session's hardware is never more than the server's cgroup allows (issue 29).

The target row says 16 GiB (registered before its server got a 1 GiB cgroup, or by an
earlier version that read the host); the probe at the session's start finds the limit.
Hints, the knob ranges and the memory guard then size for 1 GiB: no host-sized
shared_buffers. On the simulated world of tests/app/runs/fake.py (the loop's bookkeeping);
the probe's reading of real cgroups is tested on real sandboxes in
tests/app/postgres/test_cgroups.py and tests/app/targets/test_profiles.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from app.db import Database
from app.postgres.target import Probe
from app.sessions.store import SessionStore
from tests.app.runs.fake import FakeEnv, add_session, add_target, make_db, run_session
from tests.optimizer.sim import oltp_surface

GIB = 1 << 30
_UNITS = {"": 8192, "kB": 1024, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}  # "": 8kB pages


def _bytes(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*(kB|MB|GB|TB)?", text.strip())
    assert m is not None, text
    return int(m.group(1)) * _UNITS[m.group(2) or ""]


WORKLOAD = {"builtin": "tpcb-like", "scale": 1, "clients": 2, "duration_s": 20, "warmup_s": 2}


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    d = make_db(tmp_path)
    yield d
    d.dispose()


def test_a_cgroup_limit_found_at_the_start_sizes_the_session(db: Database, tmp_path: Path) -> None:
    surface = oltp_surface()  # a 16 GiB, 4 CPU server as the row says
    env = FakeEnv(surface)
    real_probe = env.fake_target.probe

    def capped(names: Sequence[str]) -> Probe:
        note = "cgroup limits: 1.00 GiB of memory and 1 CPU(s) (the host has 16.0 GiB and 4)"
        return replace(real_probe(names), ram_bytes=GIB, cpus=1, local=True, hardware_note=note)

    env.fake_target.probe = capped  # type: ignore[method-assign]
    tid = add_target(db, surface)
    sid = add_session(
        db, tid, {"workload": WORKLOAD, "knobs": ["shared_buffers"], "max_trials": 12}
    )
    sess = run_session(db, tmp_path, sid, env)
    assert sess.status == "succeeded", sess.error
    assert sess.snapshot is not None
    assert sess.snapshot["hardware"] == {"ram_bytes": GIB, "cpus": 1}
    tried = [
        _bytes(t.config["shared_buffers"])
        for t in SessionStore(db, sid, owner=None).stored_trials()
        if "shared_buffers" in t.config
    ]
    assert tried
    assert max(tried) <= 0.9 * GIB  # never sized for 16 GiB (PGTune's hint: 4 GiB)
