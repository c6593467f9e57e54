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
    # one branch per WorkloadIn.kind (tpch, tpcc, chbench: their classes take what they use)
    if wl.kind != "pgbench":
        raise WorkloadError(f"unknown workload kind {wl.kind!r}")
    return PgbenchWorkload(
        builtin=wl.builtin,
        builtin_weight=wl.builtin_weight,
        scripts=tuple((s.sql, s.weight) for s in wl.scripts or ()),
        scale=wl.scale,
        init=wl.init,
        clients=n,
        jobs=min(wl.jobs, n),
        protocol=wl.protocol,
        isolation=wl.isolation,
        max_tries=wl.max_tries,
    )
