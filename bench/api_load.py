"""API latency under load while a session runs: 50 pollers for 30 s, loopback only.

Starts the real service (`knobtune serve` subprocess, SQLite metadata) against a sandbox,
starts a tuning session, then 50 concurrent clients poll `GET /api/v1/sessions/{id}` and
the dashboard's session page for a bounded time. Prints JSON: p50/p99 latency and error
count per endpoint. Target on a 2-core machine: p99 < 100 ms, 0 errors. The 50
connections are opened before the measured window (a viewer connects once, then polls
over the kept-alive connection). Each poller waits ``--interval`` (1 s) between requests,
as the dashboard and the CLI do; ``--interval 0`` turns it into a saturation test (50
requests always in flight).

    .venv/bin/python bench/api_load.py [--clients 50] [--seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.postgres.sandbox import Sandbox  # noqa: E402
from bench.common import run_main  # noqa: E402
from tests.helpers import ServiceProcess  # noqa: E402


async def poller(
    client: httpx.AsyncClient,
    paths: list[str],
    deadline: float,
    interval: float,
    out: dict[str, list[float]],
    errors: dict[str, int],
) -> None:
    # Like the dashboard and `knobtune tune --follow`: one poll per interval, started at
    # a random phase so that 50 pollers do not fire in lockstep.
    await asyncio.sleep(random.uniform(0, interval))
    i = 0
    while time.monotonic() < deadline:
        started = time.monotonic()
        path = paths[i % len(paths)]
        i += 1
        t0 = time.perf_counter()
        try:
            r = await client.get(path)
            ok = r.status_code == 200
        except httpx.HTTPError:
            ok = False
        dt = (time.perf_counter() - t0) * 1000
        if ok:
            out.setdefault(path, []).append(dt)
        else:
            errors[path] = errors.get(path, 0) + 1
        await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))


async def load(
    url: str, paths: list[str], clients: int, seconds: float, interval: float
) -> tuple[dict[str, list[float]], dict[str, int]]:
    out: dict[str, list[float]] = {}
    errors: dict[str, int] = {}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=10, limits=limits) as client:
        # Open the 50 connections first, unmeasured: a viewer connects once and then
        # polls over the kept-alive connection, and the measured window is that polling.
        await asyncio.gather(*(client.get(paths[0]) for _ in range(clients)))
        deadline = time.monotonic() + seconds
        await asyncio.gather(
            *(
                poller(client, paths[k % 2 :] + paths[: k % 2], deadline, interval, out, errors)
                for k in range(clients)
            )
        )
    return out, errors


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument(
        "--interval",
        type=float,
        default=1.0,
        help="seconds between one poller's requests (0: as fast as possible)",
    )
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "api_load.json"))
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="knobtune-load-") as tmp, Sandbox.create() as sb:
        service = ServiceProcess(Path(tmp))
        service.start()
        url = service.url
        try:
            api = httpx.Client(base_url=url, timeout=30)
            # workloads never run as a superuser: the sandbox's benchmark role (issue 40)
            body = {"name": "load", "dsn": sb.dsn, "workload_dsn": sb.bench_dsn}
            tid = api.post("/api/v1/targets", json=body).json()["id"]
            sid = api.post(
                "/api/v1/sessions",
                json={
                    "target_id": tid,
                    # reload-only knobs, enough of them that the session outlasts the load
                    "knobs": [
                        "work_mem",
                        "max_wal_size",
                        "checkpoint_completion_target",
                        "bgwriter_lru_maxpages",
                        "random_page_cost",
                        "effective_cache_size",
                    ],
                    "hints": False,
                    "max_trials": 200,
                    "workload": {
                        "builtin": "tpcb-like",
                        "scale": 1,
                        "clients": 2,
                        "jobs": 1,
                        "duration_s": 5,
                        "warmup_s": 1,
                    },
                },
            ).json()["id"]
            while api.get(f"/api/v1/sessions/{sid}").json()["progress"]["trials_done"] < 2:
                time.sleep(0.5)  # a few trials exist, a benchmark is running
            paths = [f"/api/v1/sessions/{sid}", f"/sessions/{sid}"]
            lat, errors = asyncio.run(load(url, paths, args.clients, args.seconds, args.interval))
            state = api.get(f"/api/v1/sessions/{sid}").json()
            api.post(f"/api/v1/sessions/{sid}/cancel")
            # the cancel lands (settings restored) before the service is stopped: a SIGTERM
            # during the restore hung the service until ServiceProcess.stop's SIGKILL, 30 s
            # later (the shutdown put back the default connection policy first, which then
            # refused the restore's connection to the sandbox's socket)
            deadline = time.monotonic() + 60
            while api.get(f"/api/v1/sessions/{sid}").json()["status"] in ("queued", "running"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"session {sid} did not end within 60 s of its cancel")
                time.sleep(0.2)
        finally:
            service.stop()
    result: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "clients": args.clients,
        "interval_s": args.interval,
        "seconds": args.seconds,
        "cpus": os.cpu_count(),
        "session_status_during_load": state["status"],
        "trials_during_load": state["progress"]["trials_done"],
        "endpoints": {},
    }
    for path, xs in sorted(lat.items()):
        a = np.array(xs)
        name = path.rsplit("/", 1)[0] + "/{id}"
        result["endpoints"][name] = {
            "requests": int(a.size),
            "errors": errors.get(path, 0),
            "p50_ms": round(float(np.percentile(a, 50)), 1),
            "p99_ms": round(float(np.percentile(a, 99)), 1),
            "max_ms": round(float(a.max()), 1),
        }
    for path, n in errors.items():
        if path not in lat:
            result["endpoints"][path.rsplit("/", 1)[0] + "/{id}"] = {"requests": 0, "errors": n}
    text = json.dumps(result, indent=2)
    Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    run_main(main)
