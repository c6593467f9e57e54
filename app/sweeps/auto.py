"""Sessions with clients "auto" (issue 16, part 3): the session's own short client sweep.

The sweep is stored like any other (status succeeded, ``result.session_id``), so the
session's note, its export and later sessions can refer to it.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from app.db import Database, utcnow
from app.models import Sweep, TuningSession
from app.postgres.benchlock import HostBenchLock
from app.postgres.pgbench import pgbench_jobs
from app.sessions.schemas import SessionIn
from app.sweeps.measure import SweepError, measure
from app.sweeps.schemas import SweepIn

AUTO_RUN_S = 10  # longest run of a session's own sweep (its runs are short by design)


def _sweep_of(wl: Any) -> SweepIn:
    """The sweep of a session's workload: same scripts and data, short runs, no -C."""
    duration = max(3, min(int(wl.duration_s), AUTO_RUN_S))
    return SweepIn(
        builtin=wl.builtin,
        builtin_weight=wl.builtin_weight,
        scripts=wl.scripts,
        scale=wl.scale,
        init=wl.init,
        protocol=wl.protocol,
        jobs=wl.jobs,
        duration_s=duration,
        warmup_s=min(int(wl.warmup_s), duration - 1),
        connect_cost=False,
    )


def jobs_capped_text(result: dict[str, Any]) -> str:
    """The words for a session's jobs lowered to its knee ("" when they were not)."""
    capped = result.get("jobs_capped")
    if not capped:
        return ""
    return (
        f"jobs {capped['from']} lowered to {capped['to']}: the session runs at the knee, "
        f"{result['knee_clients']} clients, and pgbench runs at most one thread per client"
    )


def auto_clients(
    db: Database,
    session_id: int,
    body: SessionIn,
    dsn: str,
    cpus: int | None,
    stop: threading.Event | None,
    workdir: Path,
    *,
    bench_lock: HostBenchLock | None = None,
) -> SessionIn:
    """Sweep the session's workload and return its request with ``clients`` = the knee.

    The sweep is stored (status succeeded, ``result.session_id``), so the session's note,
    its export and later sessions can refer to it. Raises SweepError when no knee came out
    (every run failed); a stop returns the request unchanged (the caller checks its flag).
    """
    wl = body.workload
    sweep_body = _sweep_of(wl)
    started = utcnow()
    result = measure(
        dsn,
        sweep_body,
        cpus=cpus,
        stop=stop,
        workdir=workdir.resolve() / "sweep",
        app_name=f"knobtune-pgbench-s{session_id}",
        bench_lock=bench_lock,
    )
    if result["stopped"]:
        return body
    knee = result["knee_clients"]
    if knee is None:
        errors = [r["error"] for r in result["runs"] if r.get("error")]
        raise SweepError(
            "clients auto: the client sweep measured nothing"
            + (f" (first error: {errors[0]})" if errors else "")
        )
    jobs = pgbench_jobs(wl.jobs, knee)
    if jobs < wl.jobs:
        result["jobs_capped"] = {"from": wl.jobs, "to": jobs}
        result["advice"] = [*result.get("advice", []), jobs_capped_text(result)]
    with db.session() as s:
        sess = s.get(TuningSession, session_id)
        assert sess is not None
        sw = Sweep(
            target_id=sess.target_id,
            status="succeeded",
            phase="succeeded",
            request=sweep_body.model_dump(mode="json"),
            runs=result["runs"],
            result={**result, "session_id": session_id},
            knee_clients=knee,
            best_clients=result["best_clients"],
            best_tps=result["best_tps"],
            cancel_requested=False,
            created_at=started,
            started_at=started,
            finished_at=utcnow(),
        )
        s.add(sw)
    new_wl = wl.model_copy(update={"clients": knee, "jobs": jobs})
    return body.model_copy(update={"workload": new_wl})
