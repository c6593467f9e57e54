"""Workload kinds: each prepares its data and describes a run as pgbench streams.

:func:`workload_for` is the one place that maps a request to a workload.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.workloads.base import Workload, WorkloadError

if TYPE_CHECKING:
    from app.schemas import WorkloadIn


def workload_for(wl: WorkloadIn, *, clients: int | None = None) -> Workload:
    """The workload of a request. ``clients``: the resolved count when wl.clients is "auto"
    (before the sweep has run, stream names and scripts are all a caller can use)."""
    from app.workloads.pgbench import PgbenchWorkload

    n = clients if clients is not None else (wl.clients if isinstance(wl.clients, int) else 1)
    queries = tuple(wl.queries) if wl.queries else None
    try:
        if wl.builtin == "tpch":
            from app.workloads.tpch import Tpch

            return Tpch(
                scale=wl.scale, mode=wl.mode, clients=n, queries=queries, protocol=wl.protocol
            )
        if wl.builtin == "tpcc":
            from app.workloads.tpcc import Tpcc

            return Tpcc(
                warehouses=int(wl.scale),
                clients=n,
                isolation=wl.isolation,
                max_tries=wl.max_tries or 10,
                protocol=wl.protocol,
            )
        if wl.builtin == "chbench":
            from app.workloads.chbench import Chbench

            return Chbench(
                warehouses=int(wl.scale),
                oltp_clients=n,
                olap_clients=wl.olap_clients,
                isolation=wl.isolation,
                max_tries=wl.max_tries or 10,
                queries=queries,
                protocol=wl.protocol,
            )
    except ValueError as exc:  # a constructor's check of its arguments
        raise WorkloadError(str(exc)) from exc
    return PgbenchWorkload(
        builtin=wl.builtin,
        builtin_weight=wl.builtin_weight,
        scripts=tuple((s.sql, s.weight) for s in wl.scripts or ()),
        scale=int(wl.scale),
        init=wl.init,
        clients=n,
        jobs=min(wl.jobs, n),
        protocol=wl.protocol,
        isolation=wl.isolation,
        max_tries=wl.max_tries or 1,
    )
