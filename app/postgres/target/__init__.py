"""Control of a real PostgreSQL target: probe, snapshot, apply/verify, revert, restart.

Every change goes through ``ALTER SYSTEM`` (composed with ``sql.Identifier`` and
``sql.Literal``, never string formatting), so the target's own files stay as
they were and a revert is a matter of restoring ``postgresql.auto.conf`` entries.
Every failure path ends with the server up and the previous entries back, or
with an error that says exactly what could not be restored.

The rest of knobtune uses :class:`TargetController` (controller.py), a façade over one
module per capability, each importing only those above it in this list:

* errors.py      the exceptions (TargetError and its kinds)
* connection.py  connecting with knobtune's timeouts; is the server up
* conf_files.py  the data directory, postgresql.auto.conf's entries, reload, validation
* probe.py       version, settings, privileges, server identity, hardware
* measure.py     buffer pool fill and allocations, the server's memory
* restarts.py    running the restart method, recovery when a restart fails
* change.py      snapshot, apply/verify/rollback, revert
"""

from app.postgres.dsn import mask_dsn
from app.postgres.target.change import ApplyResult, Snapshot
from app.postgres.target.conf_files import parse_conf, render_auto_conf
from app.postgres.target.controller import TargetController
from app.postgres.target.errors import (
    ApplyError,
    ConnectError,
    PrivilegeError,
    RestartUnavailable,
    TargetError,
)
from app.postgres.target.measure import PoolCounter, PoolFill
from app.postgres.target.probe import MIN_STATEMENT_TIMEOUT_MS, Probe, server_identity
from app.postgres.target.probe import _may_read_files as _may_read_files
from app.postgres.target.probe import _read_server_files as _read_server_files
from app.postgres.target.restarts import clear_dead_postmaster

__all__ = [
    "MIN_STATEMENT_TIMEOUT_MS",
    "ApplyError",
    "ApplyResult",
    "ConnectError",
    "PoolCounter",
    "PoolFill",
    "PrivilegeError",
    "Probe",
    "RestartUnavailable",
    "Snapshot",
    "TargetController",
    "TargetError",
    "clear_dead_postmaster",
    "mask_dsn",
    "parse_conf",
    "render_auto_conf",
    "server_identity",
]
