"""Workload kinds: each prepares its data and describes a run as pgbench streams.

:func:`workload_for` is the one place that maps a request to a workload: a replay, one of
knobtune's own kinds (BUILDERS: a builder per kind of kinds.KNOBTUNE_BUILTINS), or else
pgbench. schemas.py holds that request (WorkloadIn), each workload's defaults and the
rules between its fields; kinds.py names the builtin kinds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from app.workloads.base import Workload, WorkloadError

if TYPE_CHECKING:
    from app.workloads.replay import CaptureSource
    from app.workloads.schemas import WorkloadIn

# Where a replay's captured log comes from: capture id -> its log text (or a
# CaptureSource: the text and the captured database). The capture store registers it at
# the service's start (set_capture_loader); workloads never import the store. The loader
# raises WorkloadError (or LookupError for an unknown id) with a message for the user.
CaptureLoader = Callable[[int], "str | CaptureSource"]
_capture_loader: CaptureLoader | None = None


def set_capture_loader(loader: CaptureLoader | None) -> None:
    """Register how a replay gets its capture's log (None: replays are unavailable)."""
    global _capture_loader
    _capture_loader = loader


def _capture(capture_id: int) -> Callable[[], str | CaptureSource]:
    """The log of ``capture_id``, loaded when the replay first needs it."""
    loader = _capture_loader
    if loader is None:
        raise WorkloadError("replays are not available: this service has no capture store")

    def load() -> str | CaptureSource:
        try:
            return loader(capture_id)
        except LookupError:
            raise WorkloadError(f"unknown capture {capture_id}") from None

    return load


# -- knobtune's own workloads (kinds.KNOBTUNE_BUILTINS): each kind's builder, from the
# request and the resolved client count. Each imports its module when called, so this
# package stays cheap to import (the CLI reads kinds.py: tests/app/cli/test_import_cost.py).
# pgbench's builtins and the user's own scripts are PgbenchWorkload (workload_for).
Builder = Callable[["WorkloadIn", int], Workload]


def _tpch(wl: WorkloadIn, clients: int) -> Workload:
    from app.workloads.tpch import Tpch

    queries = tuple(wl.queries) if wl.queries else None
    return Tpch(
        scale=wl.scale, mode=wl.mode, clients=clients, queries=queries, protocol=wl.protocol
    )


def _tpcc(wl: WorkloadIn, clients: int) -> Workload:
    from app.workloads.tpcc import Tpcc

    return Tpcc(
        warehouses=int(wl.scale),
        clients=clients,
        isolation=wl.isolation,
        max_tries=wl.max_tries or 10,
        protocol=wl.protocol,
    )


def _chbench(wl: WorkloadIn, clients: int) -> Workload:
    from app.workloads.chbench import Chbench

    return Chbench(
        warehouses=int(wl.scale),
        oltp_clients=clients,
        olap_clients=wl.olap_clients,
        isolation=wl.isolation,
        max_tries=wl.max_tries or 10,
        queries=tuple(wl.queries) if wl.queries else None,
        protocol=wl.protocol,
    )


BUILDERS: dict[str, Builder] = {"tpch": _tpch, "tpcc": _tpcc, "chbench": _chbench}


def workload_for(
    wl: WorkloadIn, *, clients: int | None = None, admin_dsn: str | None = None
) -> Workload:
    """The workload of a request. ``clients``: the resolved count when wl.clients is "auto"
    (before the sweep has run, stream names and scripts are all a caller can use).
    ``admin_dsn``: the target's superuser when the cluster is knobtune's own
    (app.targets.access.admin_dsn_for): a replay's copies are made by it."""
    # imported here, not at the top: this package stays cheap to import (see BUILDERS)
    from app.postgres.pgbench import pgbench_jobs
    from app.workloads.pgbench import PgbenchWorkload

    n = clients if clients is not None else (wl.clients if isinstance(wl.clients, int) else 1)
    build = BUILDERS.get(wl.builtin or "")
    try:
        if wl.replay is not None:
            from app.workloads.replay import Replay

            return Replay(
                _capture(wl.replay),
                duration_s=wl.duration_s,
                warmup_s=wl.warmup_s,
                speed=wl.speed,
                replay_database=wl.replay_database,
                isolation=wl.isolation,
                admin_dsn=admin_dsn,
            )
        if build is not None:
            return build(wl, n)
    except ValueError as exc:  # a constructor's check of its arguments
        raise WorkloadError(str(exc)) from exc
    return PgbenchWorkload(
        builtin=wl.builtin,
        builtin_weight=wl.builtin_weight,
        scripts=tuple((s.sql, s.weight) for s in wl.scripts or ()),
        scale=int(wl.scale),
        init=wl.init,
        clients=n,
        jobs=pgbench_jobs(wl.jobs, n),
        protocol=wl.protocol,
        isolation=wl.isolation,
        max_tries=wl.max_tries or 1,
    )
