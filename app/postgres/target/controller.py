"""TargetController: the one object through which the rest of knobtune controls a target.

A façade: each capability lives in its own module of this package, and the controller
composes them and serializes the calls that change the server (apply, revert,
recover_offline).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.postgres.memory import MemoryMeter
from app.postgres.restart import RestartMethod
from app.postgres.target.change import ApplyResult, Changer, Snapshot
from app.postgres.target.conf_files import ConfFiles
from app.postgres.target.connection import Connector
from app.postgres.target.measure import Measurer, PoolCounter, PoolFill
from app.postgres.target.probe import Probe, Prober
from app.postgres.target.restarts import Restarter

if TYPE_CHECKING:
    from app.postgres.sandbox import Sandbox


class TargetController:
    """Applies and reverts settings of one target, restarting it when a knob needs that.

    ``restart`` is one of the operator's declared restart methods (app/postgres/restart.py:
    pg_ctl, systemd, container or a named argv command, run without a shell), or a
    sandbox's own; never a command from an API client. ``no_restart_reason`` says why
    there is none (e.g. a stored legacy restart_command that is not run any more).
    ``data_dir`` is the target's data directory when it is on this host: it lets
    knobtune validate a pending config with ``postgres -C`` and restore
    ``postgresql.auto.conf`` while the server is down. It is used only once its
    global/pg_control shows the server's system identifier; ``trust_data_dir`` (the
    operator's own configuration, never a client's word) also accepts it when that
    cannot be checked.
    """

    def __init__(
        self,
        dsn: str,
        *,
        restart: RestartMethod | None = None,
        no_restart_reason: str | None = None,
        data_dir: Path | None = None,
        trust_data_dir: bool = False,
        restart_timeout_s: float | None = None,
        log_path: Path | None = None,
        connect_timeout_s: float = 10.0,
        verify_timeout_s: float = 10.0,
    ) -> None:
        self._db = Connector(dsn, connect_timeout_s=connect_timeout_s)
        self._files = ConfFiles(
            self._db,
            data_dir=data_dir,
            trust_data_dir=trust_data_dir,
            verify_timeout_s=verify_timeout_s,
        )
        self._prober = Prober(self._db, self._files)
        self._restarts = Restarter(
            self._db,
            self._files,
            restart=restart,
            no_restart_reason=no_restart_reason,
            restart_timeout_s=restart_timeout_s,
            log_path=log_path,
        )
        self._changer = Changer(
            self._db, self._files, self._prober, self._restarts, verify_timeout_s=verify_timeout_s
        )
        self._measurer = Measurer(self._db, self._files)
        self._lock = threading.RLock()

    @classmethod
    def for_sandbox(cls, sandbox: Sandbox, **kwargs: Any) -> TargetController:
        """A controller with the sandbox's own restart method, data directory and log."""
        return cls(
            sandbox.dsn,
            restart=sandbox.restart_method,
            data_dir=sandbox.data_dir,
            trust_data_dir=True,
            log_path=sandbox.log_path,
            **kwargs,
        )

    # -- what it was made with ------------------------------------------------------
    @property
    def dsn(self) -> str:
        return self._db.dsn

    @property
    def local(self) -> bool:
        """Whether the DSN leads to this host."""
        return self._db.local

    @local.setter
    def local(self, value: bool) -> None:
        self._db.local = value

    @property
    def connect_timeout_s(self) -> float:
        return self._db.connect_timeout_s

    @property
    def verify_timeout_s(self) -> float:
        return self._changer.verify_timeout_s

    @property
    def restart(self) -> RestartMethod | None:
        return self._restarts.restart

    @property
    def no_restart_reason(self) -> str:
        return self._restarts.no_restart_reason

    @no_restart_reason.setter
    def no_restart_reason(self, value: str) -> None:
        self._restarts.no_restart_reason = value

    @property
    def restart_timeout_s(self) -> float:
        return self._restarts.restart_timeout_s

    @property
    def log_path(self) -> Path | None:
        return self._restarts.log_path

    @property
    def data_dir_verified(self) -> bool:
        """Whether the given data directory was accepted as this server's (after probe())."""
        return self._files.data_dir is not None

    @property
    def can_restart(self) -> bool:
        return self._restarts.can_restart

    # -- connections (connection.py) ------------------------------------------------
    def is_up(self) -> bool:
        """Whether the server accepts our connection and answers a query."""
        return self._db.is_up()

    def wait_until_up(self, timeout_s: float) -> bool:
        """Poll until the server accepts connections; False after ``timeout_s``."""
        return self._db.wait_until_up(timeout_s)

    def terminate_clients(self, application_prefix: str) -> int:
        """End the target's connections whose application_name starts with the prefix
        (Connector.terminate_clients)."""
        return self._db.terminate_clients(application_prefix)

    # -- reading (probe.py) ---------------------------------------------------------
    def probe(self, names: Sequence[str]) -> Probe:
        return self._prober.probe(names)

    def server_id(self) -> str | None:
        """The server's identity (:func:`server_identity`), read now."""
        return self._prober.server_id()

    # -- changing (change.py, restarts.py) --------------------------------------------
    def skip_reasons(self, names: Sequence[str]) -> dict[str, str]:
        """Knobs among ``names`` that cannot be applied on this target, with the reason.

        A knob that needs a restart is listed when there is no restart method.
        """
        return self._changer.skip_reasons(names)

    def snapshot(self, names: Sequence[str]) -> Snapshot:
        """ALTER SYSTEM entries and effective values of ``names`` (unknown names are skipped)."""
        return self._changer.snapshot(names)

    def apply(
        self,
        config: Mapping[str, str],
        *,
        on_restart: Callable[[], None] | None = None,
        allow_pending: bool = False,
    ) -> ApplyResult:
        """ALTER SYSTEM SET each knob, reload (restart if needed), verify the effective
        values: see Changer.apply."""
        with self._lock:
            return self._changer.apply(config, on_restart=on_restart, allow_pending=allow_pending)

    def revert(self, snapshot: Snapshot) -> ApplyResult:
        """Make postgresql.auto.conf exactly as in ``snapshot``; reload, restart if needed."""
        with self._lock:
            return self._changer.revert(snapshot)

    def recover_offline(self, snapshot: Snapshot) -> str:
        """Bring back a server that a restart of ours left down, with ``snapshot``'s entries.

        For a restart interrupted by a crash of the service (the candidate may not
        boot and nobody rolled it back): postgresql.auto.conf is rewritten to exactly
        the snapshot's entries (a state that booted) and the restart command is run.
        Never call it for a server someone else stopped. Returns what was done;
        raises TargetError when the server stays down.
        """
        with self._lock:
            return self._restarts.recover_offline(snapshot.auto_conf)

    # -- measuring (measure.py) -----------------------------------------------------
    def memory_meter(self) -> MemoryMeter | None:
        """A reader of this server's memory while it runs (app/postgres/memory.py), or None
        for a server on another host (or in another PID namespace)."""
        return self._measurer.memory_meter()

    def buffer_pool(self) -> PoolFill | None:
        """How full shared_buffers is now (None: the server cannot be asked); see
        Measurer.buffer_pool."""
        return self._measurer.buffer_pool()

    def pool_counter(self) -> contextlib.AbstractContextManager[PoolCounter | None]:
        """Buffers allocated so far and the pool's size in buffers, read over one connection
        (a warm-up's), or None when the server cannot be asked."""
        return self._measurer.pool_counter()
