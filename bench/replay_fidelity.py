"""Does a replay predict the original? (issue 28)

    .venv/bin/python bench/replay_fidelity.py          # about 70 minutes
    .venv/bin/python bench/replay_fidelity.py --small  # every step at its smallest (tests)

A capture is worth tuning on only if a change that helps or hurts the captured server
helps or hurts its replay the same way, and a change that does nothing there does nothing
in the replay. This script measures that on two sandboxes of this host, through the
product's own paths (a ``knobtune serve`` subprocess's REST API for the capture and the
session, the session's trial executor for every measured run, bench/common.py for the
interleaving and the paired statistics):

1. **Production**, P: a sandbox with the logging collector and pg_stat_statements (what
   a capture needs), database ``shop`` owned by the benchmark role (the application's),
   on a slow disk (``--disk-iops``, a cgroup: a network disk's millisecond fsyncs; the
   replay's server R gets the same cap). Its known mix, through pgbench, both streams at
   once: TPC-C (app/workloads/tpcc.py, ``--warehouses``, ``--clients``) and a reporting
   stream (``--report-clients``) whose query sorts one warehouse's order lines by a wide
   column (it spills to disk at work_mem 4MB and sorts in memory at 64MB: EXPLAIN ANALYZE
   on the loaded data, recorded in the output). The mix's objective is throughput (a
   session on it would tune that): the geometric mean of both streams' levels.
2. **The starting data.** P's data back at its loaded state (TPC-C's reset), then
   ``pg_dump -Fc`` of ``shop`` and ``pg_restore --create`` into a second sandbox R
   (staging), with its owners: the benchmark role, which replays there (and is given
   CREATEDB: it makes each run's copy, as a client's staging server's workload role
   does), then ANALYZE (a restore carries no planner statistics): R holds exactly the
   data the capture starts from.
3. **The capture**: ``POST /api/v1/captures`` on P for ``--minutes``; the mix starts once
   the capture logs, and ends before it does. Its summary and the log (the download route)
   come back through the API.
4. **Fidelity.** Two pairs of configs, each A B B A ... for ``--rounds`` rounds, on each
   side: the ORIGINAL (P, the pgbench mix, its data reset before every run as TPC-C's
   workload does; with ``--original-checkpoint`` a CHECKPOINT after it; with
   ``--original-fresh`` a fresh file copy of its loaded state instead, as the replay's)
   and the REPLAY (R, the Replay workload on the capture: a fresh copy of ``shop`` before
   every run):

   * the known effect: synchronous_commit on against off. On a disk whose fsync takes
     milliseconds every TPC-C commit waits for its WAL flush, and off stops the wait
     (issue 29 measured +75% on TPC-B at 1,000 IOPS). The first run's known effect,
     work_mem on the reporting sort, was not there on the original (a spill to the page
     cache costs little: docs/results/replay-fidelity.md);
   * a no-op: vacuum_cost_delay 0 against 2ms. Only VACUUM and ANALYZE run by hand read
     it (autovacuum has its own autovacuum_vacuum_cost_delay, 2ms by default): neither
     measured window holds one (TPC-C's reset vacuums before its run starts, and the
     capture starts after the reset). A knob of the background writer or of checkpoints
     would touch the mix through its writes, however little; this one cannot.

   Per pair and side: the change in the reporting query's mean latency (the original's
   "report" transactions, the replay's label of that query) and in the mix's level
   (the original: its objective, throughput, and latency_mean beside it; the replay:
   latency_mean and statements a second, ``--replay-objective`` the one compared and the
   session's objective: latency_mean at the captured pace, rate (the session's
   throughput) with ``--speed 4``, faster than the server can go, so that every session
   runs back to back as pgbench's clients do), each with a 95% interval and p-value
   (paired t on the rounds' log ratios). Printed: whether the replay's change has the
   original's sign and lies inside its interval (levels in different units are compared
   as log ratios of levels: by Little's law a closed loop's throughput moves as the
   inverse of its mean latency), and whether the no-op's intervals hold 0 on both sides.
5. **Tune from the capture, confirm on the original.** A session on R with the replay as
   its workload (``--budget-s``; memory, planner and WAL knobs: work_mem, shared_buffers,
   random_page_cost, wal_buffers, commit_delay, max_wal_size, R's own restart method
   handed to the service for those that need one; and synchronous_commit as a durability
   trade, ``allow_unsafe``, labelled so), then,
   when it changed anything, its best config against the default on P's original
   mix, interleaved, each run after a discarded warm-up run (a restart empties
   shared_buffers).
6. **Output** (``--out``, JSON): every run (levels, per-label latencies, failed
   statements), the capture's summary and the mix that ran during it, the pairs'
   estimates and the checks, the session's claim and the confirmation, the timings of
   each step, the load average before and after.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.captures.logparse import label_text  # noqa: E402
from app.postgres.binaries import find_bindir  # noqa: E402
from app.postgres.cgroups import Limits  # noqa: E402
from app.postgres.connect import libpq_env  # noqa: E402
from app.postgres.dsn import scrub  # noqa: E402
from app.postgres.pgbench import run_streams  # noqa: E402
from app.postgres.sandbox import BENCH_ROLE, Sandbox, as_postgres  # noqa: E402
from app.postgres.target import TargetController  # noqa: E402
from app.sessions.trial import TrialExecutor, TrialOutcome  # noqa: E402
from app.workloads import set_capture_loader, workload_for  # noqa: E402
from app.workloads.base import Script, Stream, Workload  # noqa: E402
from app.workloads.replay import CaptureSource  # noqa: E402
from app.workloads.schemas import WorkloadIn  # noqa: E402
from app.workloads.stream_run import bench_spec  # noqa: E402
from app.workloads.tpcc import Tpcc  # noqa: E402
from bench.common import (  # noqa: E402
    interleaved,
    load_average,
    machine,
    measured,
    paired_gain,
    run_main,
    shown,
)
from bench.e2e import tune  # noqa: E402
from optimizer.evidence import Objective, StreamStat, run_level, unfinished  # noqa: E402
from tests.helpers import PGSS, ServiceProcess, logging_sandbox, wait_capture  # noqa: E402

DATABASE = "shop"
LOADED = "shop_loaded"  # --original-fresh: P's shop at its loaded state, copied before each run
# One warehouse's order lines (~300,000 at load) sorted by a wide column: an external
# merge of ~15 MB at work_mem 4MB, a quicksort in ~36 MB at 64MB (EXPLAIN ANALYZE on 2
# warehouses). OFFSET past the end: the whole sort runs, no row travels to the client.
REPORT_SELECT = (
    "SELECT ol_o_id, ol_d_id, ol_number, ol_amount FROM (SELECT ol_o_id, ol_d_id, "
    "ol_number, ol_amount, ol_dist_info FROM order_line WHERE ol_w_id = {w} "
    "ORDER BY ol_dist_info, ol_amount DESC) AS report OFFSET 100000000"
)
REPORT_SCRIPT = "\\set w random(1, :warehouses)\n" + REPORT_SELECT.format(w=":w") + ";\n"
# --report-pause-ms: the reporting client waits this long after each query (pgbench \sleep,
# never sent to the server: the capture holds the queries only)
PAUSE = "\\sleep {ms} ms\n"
REPORT_LABEL = label_text(REPORT_SELECT.format(w=1))  # the replay's label of that query
# The session's knobs: memory, planner and WAL, and synchronous_commit as a durability trade
# (the session is given allow_unsafe for it, and labels it so).
KNOBS = [
    "work_mem",
    "shared_buffers",
    "random_page_cost",
    "wal_buffers",
    "commit_delay",
    "max_wal_size",
]
UNSAFE = "synchronous_commit"
# The pairs: the known effect and the no-op (the module docstring says why each).
PAIRS: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    "synchronous_commit": ({"synchronous_commit": "on"}, {"synchronous_commit": "off"}),
    "no-op": ({"vacuum_cost_delay": "0"}, {"vacuum_cost_delay": "2ms"}),
}
ORIGINAL_KINDS = ("throughput", "latency_mean", "rate")  # the mix's objective first
# Both levels of every replay run. At the captured pace (speed 1) a replay's throughput is
# the capture's, and latency_mean is what a config changes. Faster than any config can go
# (--speed 4) every session runs its statements back to back, a closed loop as pgbench's,
# and statements a second is what a config changes (--replay-objective rate).
# "rate": the first stream's per-second samples after the warm-up, averaged (what a session
# judges a one-stream workload's throughput on): the replay's statements a second, and on
# the original TPC-C's transactions a second, which move as its statements do (the mix of
# transactions is fixed). The original's objective, "throughput", is the geometric mean of
# both streams' levels, the reporting stream's included.
REPLAY_KINDS = ("latency_mean", "rate")


def objective_kind(kind: str) -> str:
    """The session objective a level is measured as."""
    return "throughput" if kind == "rate" else kind


FULL: dict[str, Any] = {
    "minutes": 3.0,
    "rounds": 4,
    "duration": 60,
    "warmup": 5,
    "session_duration": 40,
    "budget_s": 600.0,
    "final_check_runs": 6,
    "confirm_warmup": 10,
    "warehouses": 2,
    "clients": 4,
    "report_clients": 1,
    "disk_iops": 300,
    "capture_rate": None,  # flat out, as in every original run
    "report_pause_ms": 0,
}
SMALL: dict[str, Any] = {
    "minutes": 10 / 60,  # a capture's shortest
    "rounds": 1,
    "duration": 2,
    "warmup": 1,
    "session_duration": 2,
    "budget_s": 10.0,
    "final_check_runs": 0,
    "confirm_warmup": 0,  # none: warmed up only after a restart
    "warehouses": 1,
    "clients": 2,
    "report_clients": 1,
    "disk_iops": 300,
    # The capture's mix throttled (pgbench -R 10 a stream; the reporting client, always
    # behind that schedule, pauses 1.5 s after each query): --small checks the path, never
    # a level, and 8 s flat out kept a CPU busy that the suite's other workers wait for.
    # The capture then holds ~500 statements and ~5 reporting sorts, not ~5,500 and ~12,
    # and each replay run replays them (every one of its runs holds a reporting query);
    # the pause also leaves each original run 1-2 sorts, not 3. The original's runs stay
    # flat out: each 2 s run must finish every TPC-C transaction type (4% of the mix the
    # rarest) for its throughput to have a level.
    "capture_rate": 10.0,
    "report_pause_ms": 1500,
}


@dataclass(frozen=True)
class Production:
    """The known mix: TPC-C's streams and a reporting stream on TPC-C's data."""

    tpcc: Tpcc
    report_clients: int
    report_pause_ms: int = 0  # --report-pause-ms (REPORT_SCRIPT then PAUSE)
    # --original-checkpoint: a DSN that may CHECKPOINT, run after each reset, so that every
    # original run starts at a checkpoint as every replay run does (its copy's FILE_COPY
    # checkpoints)
    checkpoint_dsn: str | None = None
    # --original-fresh: a superuser DSN with which each reset makes ``shop`` again as a
    # file copy of its loaded state (LOADED, kept by keep_loaded), as the replay's reset
    # copies R's: both sides' runs then start from the same physical data (and at a
    # checkpoint), not the original from tables and indexes that earlier runs left larger
    fresh_dsn: str | None = None

    def prepare(self, dsn: str) -> str | None:
        return self.tpcc.prepare(dsn)

    def keep_loaded(self) -> None:
        """LOADED: a copy of ``shop`` as it is now (nothing may be connected to it)."""
        self._copy(LOADED, DATABASE)

    def reset(self, dsn: str) -> None:
        if self.fresh_dsn is not None:
            self._copy(DATABASE, LOADED)
            return
        self.tpcc.reset(dsn)
        if self.checkpoint_dsn is not None:
            with psycopg.connect(self.checkpoint_dsn, autocommit=True) as conn:
                conn.execute("CHECKPOINT")

    def _copy(self, name: str, template: str) -> None:
        """Database ``name`` made again as a file copy of ``template``, owned by the
        application's role (its sessions are ended first)."""
        assert self.fresh_dsn is not None
        with psycopg.connect(self.fresh_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY OWNER {}").format(
                    sql.Identifier(name), sql.Identifier(template), sql.Identifier(BENCH_ROLE)
                )
            )

    def report_script(self) -> str:
        pause = PAUSE.format(ms=self.report_pause_ms) if self.report_pause_ms else ""
        return REPORT_SCRIPT + pause

    def streams(self) -> list[Stream]:
        report = Stream(
            name="report",
            scripts=(Script("report", self.report_script()),),
            clients=self.report_clients,
            defines={"warehouses": str(self.tpcc.warehouses)},
        )
        return [*self.tpcc.streams(), report]


# -- the data -------------------------------------------------------------------------------
def spill_check(dsn: str) -> dict[str, Any]:
    """EXPLAIN ANALYZE of the reporting query at work_mem 4MB and 64MB: its sort's method
    and space, and the execution time."""
    out: dict[str, Any] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for wm in ("4MB", "64MB"):
            conn.execute(sql.SQL("SET work_mem = {}").format(sql.Literal(wm)))
            row = conn.execute(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + REPORT_SELECT.format(w=1)
            ).fetchone()
            assert row is not None
            plan = row[0][0]
            node = _sort_node(plan["Plan"]) or {}
            out[wm] = {
                "sort_method": node.get("Sort Method"),
                "space_kb": node.get("Sort Space Used"),
                "space_type": node.get("Sort Space Type"),
                "execution_ms": round(float(plan["Execution Time"]), 1),
            }
    out["spills_at_4MB"] = out["4MB"]["space_type"] == "Disk"
    out["fits_at_64MB"] = out["64MB"]["space_type"] == "Memory"
    return out


def _sort_node(node: dict[str, Any]) -> dict[str, Any] | None:
    if node.get("Node Type") == "Sort":
        return node
    for child in node.get("Plans", []):
        found = _sort_node(child)
        if found is not None:
            return found
    return None


def client_tool(name: str, args: list[str], dsn: str, cwd: Path) -> float:
    """pg_dump or pg_restore of the server's version, connecting as ``dsn`` does (the
    password in its environment, never on the command line), as the postgres OS user when
    root; the seconds it took. RuntimeError with its message when it fails."""
    argv = as_postgres([str(find_bindir() / name), *args])
    t = time.monotonic()
    res = subprocess.run(
        argv,
        env=libpq_env(dsn),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=3600,
        stdin=subprocess.DEVNULL,
    )
    if res.returncode != 0:
        said = scrub(res.stderr.strip()[-2000:], dsn)
        raise RuntimeError(f"{name} failed (exit {res.returncode}): {said}")
    return round(time.monotonic() - t, 1)


def dump_and_restore(prod: Sandbox, staging: Sandbox, workdir: Path) -> dict[str, Any]:
    """P's shop, as the capture will start from it, restored into R (docs/captures.md).

    R is a DSN target of the service (this script made it, not the service), so the
    replay's role, R's benchmark role as on P, makes each run's copy itself: as on a
    client's staging server, it owns shop (restored with its owners: the role exists on
    R under the same name) and is given CREATEDB (what Replay.prepare asks of a DSN
    target's workload role; a managed sandbox's superuser copies instead)."""
    dump = workdir / f"{DATABASE}.dump"
    dumped = client_tool(
        "pg_dump", ["--format=custom", f"--file={dump}"], _db(prod.dsn, DATABASE), workdir
    )
    restored = client_tool(
        "pg_restore", ["--create", "--dbname=postgres", str(dump)], staging.dsn, workdir
    )
    t = time.monotonic()
    with psycopg.connect(staging.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER ROLE {} CREATEDB").format(sql.Identifier(BENCH_ROLE)))
    with psycopg.connect(_db(staging.dsn, DATABASE), autocommit=True) as conn:
        conn.execute("ANALYZE")  # pg_restore brings no planner statistics
    return {
        "dump_bytes": dump.stat().st_size,
        "dump_s": dumped,
        "restore_s": restored,
        "analyze_s": round(time.monotonic() - t, 1),
    }


def _db(dsn: str, database: str) -> str:
    return make_conninfo(dsn, dbname=database)


# -- the capture -----------------------------------------------------------------------------
def capture(
    api: httpx.Client,
    target_id: int,
    mix: Production,
    app_dsn: str,
    seconds: int,
    rate: float | None = None,
) -> dict[str, Any]:
    """A live capture of P through the API while the mix runs; its body and log."""
    r = api.post(
        "/api/v1/captures",
        json={"target_id": target_id, "name": "fidelity", "seconds": seconds, "database": DATABASE},
    )
    if r.status_code != 202:
        raise SystemExit(f"the service refused the capture ({r.status_code}): {r.text}")
    cid = int(r.json()["id"])
    wait_capture(api, cid, until="logging", timeout=120)
    # the mix starts once every statement is logged, and ends before the capture does
    specs = [bench_spec(st, duration_s=seconds - 2, warmup_s=0, rate=rate) for st in mix.streams()]
    results = run_streams(app_dsn, specs)
    failed = [
        f"{st.name}: {r.error}" for st, r in zip(mix.streams(), results, strict=True) if not r.ok
    ]
    if failed:
        raise RuntimeError(f"the mix failed during the capture: {'; '.join(failed)}")
    body = wait_capture(api, cid, timeout=seconds + 900)
    if body["status"] != "succeeded":
        raise RuntimeError(f"capture {cid} {body['status']}: {body['error']}")
    got = api.get(f"/api/v1/captures/{cid}/log")
    got.raise_for_status()
    return {
        "id": cid,
        "body": body,
        "log": gzip.decompress(got.content).decode(),
        "mix": {
            st.name: {
                "clients": st.clients,
                "transactions": res.transactions,
                "failed": res.failed_transactions,
                "tps": res.tps,
                "latency_ms": res.latency_mean_ms,
            }
            for st, res in zip(mix.streams(), results, strict=True)
        },
    }


# -- runs and their figures ------------------------------------------------------------------
def level_of(out: TrialOutcome, streams: tuple[StreamStat, ...], kind: str) -> float | None:
    """The run's level in its units: tps for throughput, a second for rate, ms for
    latency_mean (None: a designed label never finished)."""
    if kind == "rate":
        samples = out.result.samples if out.result is not None else []
        return sum(samples) / len(samples) if samples else None
    if unfinished(streams):  # one stream's level at FLOOR would drag the geomean to nonsense
        return None
    centre = run_level(streams, kind).centre
    return math.exp(centre) if kind == "throughput" else math.exp(-centre)


def label_ms(streams: tuple[StreamStat, ...], stream: str, label: str) -> tuple[float | None, int]:
    """One label's mean latency (ms) and count in the run's measured window."""
    for s in streams:
        if s.name == stream:
            for x in s.scripts:
                if x.label == label:
                    return x.mean_ms, x.n
    return None, 0


Recorder = Callable[[int, str, TrialOutcome], None]


def recorder(
    side: str, pair: str, report: tuple[str, str], kinds: tuple[str, ...], into: list[Any]
) -> Recorder:
    """Keeps each run of a side's pair: levels, the reporting query, failures, streams."""

    def record(rnd: int, label: str, out: TrialOutcome) -> None:
        done = measured(out, f"{side} run of {label}")
        ms, n = label_ms(done, *report)
        levels = {kind: level_of(out, done, kind) for kind in kinds}
        run: dict[str, Any] = {
            "pair": pair,
            "round": rnd + 1,
            "config": label,
            "levels": levels,
            "report_ms": ms,
            "report_n": n,
            "statements_or_transactions": sum(s.transactions for s in done),
            "failed": sum(s.failed for s in done),
            "failed_by_label": {
                f"{s.name}/{x.label}": x.failed for s in done for x in s.scripts if x.failed
            },
            "streams": [s.to_json() for s in done],
            # the server's counters over the measured window: checkpoints, WAL and its
            # full-page images, blocks read, temp files (did a checkpoint fall in this run?)
            "counters": out.result.db_metrics if out.result is not None else None,
            "timings": out.timings,
            "load1": load_average(),
        }
        into.append(run)
        said = ", ".join(f"{k} {v:.4g}" for k, v in levels.items() if v is not None)
        print(
            f"  {side} {pair} round {rnd + 1} {label}: {said}; report "
            f"{'-' if ms is None else f'{ms:.1f} ms'} x{n}; {run['failed']} failed",
            file=sys.stderr,
        )

    return record


def config_label(config: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in config.items()) or "default"


def estimates(runs: list[dict[str, Any]], a: str, b: str, kinds: tuple[str, ...]) -> dict[str, Any]:
    """B against A over the rounds: the reporting query's latency change (+: slower) and
    each level's gain (+: better; latency_mean as the fraction of time saved)."""
    by_round: dict[int, dict[str, dict[str, Any]]] = {}
    for r in runs:
        by_round.setdefault(r["round"], {})[r["config"]] = r
    rounds = [x for _, x in sorted(by_round.items()) if a in x and b in x]

    def better(run: dict[str, Any], kind: str) -> float | None:
        v = run["levels"][kind]
        return None if v is None else (1.0 / v if kind == "latency_mean" else v)

    return {
        "report_latency_change": paired_gain(
            [x[b]["report_ms"] for x in rounds], [x[a]["report_ms"] for x in rounds]
        ),
        "level": {
            kind: paired_gain(
                [better(x[b], kind) for x in rounds],
                [better(x[a], kind) for x in rounds],
                lower_is_better=kind == "latency_mean",
            )
            for kind in kinds
        },
    }


def side_runs(
    side: str,
    ctl: TargetController,
    executor: TrialExecutor,
    report: tuple[str, str],
    kinds: tuple[str, ...],
    rounds: int,
) -> dict[str, Any]:
    """Both pairs on one side: every run and the estimates."""
    out: dict[str, Any] = {"runs": [], "pairs": {}}
    for pair, (a, b) in PAIRS.items():
        la, lb = config_label(a), config_label(b)
        print(f"{side}: {pair}, {la} against {lb}, {rounds} rounds", file=sys.stderr)
        runs: list[dict[str, Any]] = []
        interleaved(
            ctl, executor, {la: a, lb: b}, rounds, recorder(side, pair, report, kinds, runs)
        )
        out["runs"] += runs
        out["pairs"][pair] = {"a": la, "b": lb, **estimates(runs, la, lb, kinds)}
    return out


# -- the checks -----------------------------------------------------------------------------
def as_log(est: dict[str, Any], kind: str) -> dict[str, Any]:
    """A level's gain and interval as log ratios of levels (comparable across units)."""
    if est["gain"] is None:
        return est
    obj = Objective(kind=objective_kind(kind))  # type: ignore[arg-type]
    return {
        **est,
        "gain": obj.log_ratio(est["gain"]),
        "ci95": [obj.log_ratio(x) for x in est["ci95"]],
    }


def agreement(original: dict[str, Any], replay: dict[str, Any]) -> dict[str, bool | None]:
    """Has the replay's estimate the original's sign, and does it lie in its interval?"""
    if original["gain"] is None or replay["gain"] is None:
        return {"same_sign": None, "inside_original_ci95": None}
    low, high = original["ci95"]
    return {
        "same_sign": (original["gain"] > 0) == (replay["gain"] > 0)
        and (original["gain"] < 0) == (replay["gain"] < 0),
        "inside_original_ci95": low <= replay["gain"] <= high,
    }


def holds_zero(est: dict[str, Any]) -> bool | None:
    return None if est["ci95"] is None else est["ci95"][0] <= 0 <= est["ci95"][1]


def checks(original: dict[str, Any], replay: dict[str, Any], objective: str) -> dict[str, Any]:
    """``objective``: the replay's level compared with the original's throughput."""
    out: dict[str, Any] = {}
    for pair in PAIRS:
        o, r = original["pairs"][pair], replay["pairs"][pair]
        out[pair] = {
            "report_latency": agreement(o["report_latency_change"], r["report_latency_change"]),
            # the original's objective against the replay's, as log ratios of levels
            "level": agreement(
                as_log(o["level"]["throughput"], "throughput"),
                as_log(r["level"][objective], objective),
            ),
            "level_like_for_like": agreement(
                o["level"]["latency_mean"], r["level"]["latency_mean"]
            ),
            # TPC-C's transactions a second against the replay's statements a second
            "rate_like_for_like": agreement(o["level"]["rate"], r["level"]["rate"]),
        }
    noop_o, noop_r = original["pairs"]["no-op"], replay["pairs"]["no-op"]
    out["no-op"]["holds_zero"] = {
        "original": {
            "report_latency": holds_zero(noop_o["report_latency_change"]),
            **{k: holds_zero(v) for k, v in noop_o["level"].items()},
        },
        "replay": {
            "report_latency": holds_zero(noop_r["report_latency_change"]),
            **{k: holds_zero(v) for k, v in noop_r["level"].items()},
        },
    }
    return out


def _yes(x: bool | None) -> str:
    return "?" if x is None else "yes" if x else "no"


def report_lines(doc: dict[str, Any]) -> list[str]:
    """What the run found, in words."""
    lines: list[str] = []
    cap = doc["capture"]
    spill = doc["report_query"]["explain"]
    lines.append(
        f"reporting query at work_mem 4MB: {spill['4MB']['sort_method']} "
        f"({spill['4MB']['space_kb']} kB {spill['4MB']['space_type']}); at 64MB: "
        f"{spill['64MB']['sort_method']} ({spill['64MB']['space_kb']} kB "
        f"{spill['64MB']['space_type']})"
    )
    lines.append(f"capture {cap['id']}: {cap['summary_text'].splitlines()[0]}")
    fid, chk = doc["fidelity"], doc["checks"]
    objective = doc["args"]["replay_objective"]
    for pair in PAIRS:
        o, r, c = fid["original"]["pairs"][pair], fid["replay"]["pairs"][pair], chk[pair]
        lines.append(f"{pair}: {o['a']} -> {o['b']}")
        lines.append(
            f"  reporting query, mean latency: original {shown(o['report_latency_change'])}; "
            f"replay {shown(r['report_latency_change'])}"
        )
        lines.append(
            f"    same sign: {_yes(c['report_latency']['same_sign'])}; replay inside the "
            f"original's interval: {_yes(c['report_latency']['inside_original_ci95'])}"
        )
        lines.append(
            f"  the mix's level: original (throughput) {shown(o['level']['throughput'])}; "
            f"replay: latency_mean (time saved) {shown(r['level']['latency_mean'])}, "
            f"statements a second {shown(r['level']['rate'])}; compared: "
            f"{objective}"
        )
        lines.append(
            f"    same sign: {_yes(c['level']['same_sign'])}; inside, as log ratios: "
            f"{_yes(c['level']['inside_original_ci95'])}; original's latency_mean "
            f"{shown(o['level']['latency_mean'])}: inside "
            f"{_yes(c['level_like_for_like']['inside_original_ci95'])}"
        )
        lines.append(
            f"  rates: original TPC-C transactions a second {shown(o['level']['rate'])}; "
            f"replay statements a second {shown(r['level']['rate'])}; same sign: "
            f"{_yes(c['rate_like_for_like']['same_sign'])}; inside: "
            f"{_yes(c['rate_like_for_like']['inside_original_ci95'])}"
        )
    zero = chk["no-op"]["holds_zero"]
    lines.append(
        "no-op shows nothing (every interval holds 0): original "
        + _yes(all(zero["original"].values()) if None not in zero["original"].values() else None)
        + ", replay "
        + _yes(all(zero["replay"].values()) if None not in zero["replay"].values() else None)
    )
    sess, conf = doc["session"], doc["confirmation"]
    lines.append(
        f"session on the replay (R): kept {sess['knobs_changed'] or 'nothing'}; claim "
        f"{sess['claim']['text'] or sess['claimed_gain']}"
    )
    if conf is None:
        lines.append("confirmation on the original: none (the session kept no change)")
    else:
        lines.append(
            f"confirmed on the original against the default: throughput "
            f"{shown(conf['level']['throughput'])}; reporting query "
            f"{shown(conf['report_latency_change'])}"
        )
    return lines


# -- the whole run ---------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict[str, Any]:
    timings: dict[str, float] = {}
    clock = time.monotonic()

    def lap(step: str) -> None:
        nonlocal clock
        timings[step] = round(time.monotonic() - clock, 1)
        clock = time.monotonic()

    dumps = tempfile.TemporaryDirectory(prefix="knobtune-fidelity-")
    workdir = Path(dumps.name)
    if os.geteuid() == 0:  # the dump is written by the postgres OS user
        shutil.chown(workdir, "postgres")
    service_dir = tempfile.TemporaryDirectory(prefix="knobtune-fidelity-svc-")
    mix = Production(
        Tpcc(warehouses=args.warehouses, clients=args.clients),
        args.report_clients,
        args.report_pause_ms,
    )
    # both servers on the same slow disk: the capture's and the replay's
    disk = Limits(disk_iops=args.disk_iops) if args.disk_iops else None
    doc: dict[str, Any] = {"disk_iops": args.disk_iops}
    with (
        logging_sandbox(pgss=True, database=DATABASE, limits=disk) as prod,
        Sandbox.create(settings=PGSS, limits=disk) as staging,
        service_dir,
        dumps,
    ):
        app_dsn = _db(prod.bench_dsn, DATABASE)  # the application: the benchmark role
        if args.original_checkpoint:
            mix = dataclasses.replace(mix, checkpoint_dsn=prod.dsn)
        if args.original_fresh:
            mix = dataclasses.replace(mix, fresh_dsn=prod.dsn)
        print(f"production: loading TPC-C at {args.warehouses} warehouses", file=sys.stderr)
        doc["data"] = {"note": mix.prepare(app_dsn)}
        doc["report_query"] = {
            "script": mix.report_script(),
            "replay_label": REPORT_LABEL,
            "explain": spill_check(app_dsn),
        }
        lap("load_s")
        mix.tpcc.reset(app_dsn)  # the loaded state: what every original run starts from
        if args.original_fresh:
            mix.keep_loaded()
        doc["data"].update(dump_and_restore(prod, staging, workdir))
        lap("dump_restore_s")

        methods = {"staging": staging.restart_method.model_dump(by_alias=True)}
        service = ServiceProcess(
            Path(service_dir.name),
            KNOBTUNE_RESTART_METHODS=json.dumps(methods),
            # minutes of TPC-C's statements are more than the default 64 MiB of log text
            KNOBTUNE_CAPTURE_MAX_BYTES=str(2**30),
        )
        service.start()
        try:
            api = httpx.Client(base_url=service.url, timeout=120)
            # workloads never run as a superuser: each sandbox's benchmark role (issue 40)
            p_id = _register(
                api, {"name": "production", "dsn": prod.dsn, "workload_dsn": prod.bench_dsn}
            )
            r_id = _register(
                api,
                {
                    "name": "staging",
                    "dsn": staging.dsn,
                    "workload_dsn": staging.bench_dsn,
                    "restart_method": "staging",
                    "data_dir": str(staging.data_dir),
                },
            )
            seconds = max(10, round(args.minutes * 60))
            print(f"capture: {seconds} s of the mix on production", file=sys.stderr)
            cap = capture(api, p_id, mix, app_dsn, seconds, args.capture_rate)
            body = cap["body"]
            doc["capture"] = {
                "id": cap["id"],
                "seconds": seconds,
                "mix": cap["mix"],
                "summary": body["summary"],
                "summary_text": body["summary_text"],
                "raw_bytes": body["raw_bytes"],
                "stored_bytes": body["stored_bytes"],
                "truncated": body["truncated"],
                "notes": body["notes"],
            }
            lap("capture_s")

            # the replay as a session would build it: the capture's log, by its id
            set_capture_loader(lambda _id: CaptureSource(cap["log"], DATABASE))
            replay = workload_for(
                WorkloadIn.model_validate(
                    {
                        "replay": cap["id"],
                        "speed": args.speed,
                        "replay_database": DATABASE,
                        "duration_s": args.duration,
                        "warmup_s": args.warmup,
                    }
                )
            )
            # as the session's workload role, R's benchmark role: its copies are its own
            doc["replay_note"] = replay.prepare(staging.bench_dsn)  # parses the capture
            lap("replay_prepare_s")
            ctl_p = TargetController.for_sandbox(prod)
            ctl_r = TargetController.for_sandbox(staging)
            fidelity = {
                "original": side_runs(
                    "original",
                    ctl_p,
                    _executor(ctl_p, app_dsn, mix, args),
                    ("report", "report"),
                    ORIGINAL_KINDS,
                    args.rounds,
                ),
            }
            lap("fidelity_original_s")
            fidelity["replay"] = side_runs(
                "replay",
                ctl_r,
                _executor(ctl_r, staging.bench_dsn, replay, args),
                ("replay", REPORT_LABEL),
                REPLAY_KINDS,
                args.rounds,
            )
            lap("fidelity_replay_s")
            doc["fidelity"] = fidelity
            doc["checks"] = checks(fidelity["original"], fidelity["replay"], args.replay_objective)

            print(f"session on the replay: budget {args.budget_s:g} s", file=sys.stderr)
            spec = {
                "name": "replay",
                "chart": f"{Path(args.out).stem}-chart.svg",
                "workload": {
                    "replay": cap["id"],
                    "speed": args.speed,
                    "replay_database": DATABASE,
                },
                "kind": "mixed",
                "objective": objective_kind(args.replay_objective),
                "knobs": args.session_knobs.split(","),
            }
            session_args = argparse.Namespace(
                duration=args.session_duration,
                warmup=min(args.warmup, args.session_duration - 1),
                budget_s=args.budget_s,
                max_trials=500,  # e2e.py's default: the time budget decides
                start="current",
                final_check_runs=args.final_check_runs,
                allow_unsafe=UNSAFE,
                as_before=False,
                out=args.out,
            )
            doc["session"] = tune(api, r_id, spec, session_args)
            lap("session_s")
        finally:
            service.stop()

        # the session's whole best config, when it changed anything (in --small always: the
        # step runs, comparing the start config with itself)
        best = doc["session"]["best_config"] or {}
        doc["confirmation"] = None
        if best and (doc["session"]["knobs_changed"] or args.small):
            print(f"confirmation on production: {config_label(best)}", file=sys.stderr)
            runs: list[dict[str, Any]] = []
            executor = _executor(ctl_p, app_dsn, mix, args, warmup_run_s=args.confirm_warmup)
            interleaved(
                ctl_p,
                executor,
                {"default": {}, "tuned": best},
                args.rounds,
                recorder("original", "confirmation", ("report", "report"), ORIGINAL_KINDS, runs),
            )
            doc["confirmation"] = {
                "config": best,
                "runs": runs,
                **estimates(runs, "default", "tuned", ORIGINAL_KINDS),
            }
        lap("confirmation_s")
    doc["timings"] = timings
    return doc


def _register(api: httpx.Client, body: dict[str, Any]) -> int:
    r = api.post("/api/v1/targets", json=body)
    if r.status_code != 201:
        raise SystemExit(f"the service refused target {body['name']} ({r.status_code}): {r.text}")
    return int(r.json()["id"])


def _executor(
    ctl: TargetController,
    dsn: str,
    workload: Workload,
    args: argparse.Namespace,
    warmup_run_s: int | None = None,
) -> TrialExecutor:
    return TrialExecutor(
        ctl,
        dsn,
        workload,
        duration_s=args.duration,
        warmup_s=args.warmup,
        warmup_run_s=warmup_run_s,
    )


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--minutes", type=float, help="capture length (default 3; at least 10 s)")
    p.add_argument("--rounds", type=int, help="rounds of each pair, per side (default 4)")
    p.add_argument(
        "--duration", type=int, help="seconds per fidelity and confirmation run (default 60)"
    )
    p.add_argument("--warmup", type=int, help="seconds discarded at each run's start (default 5)")
    p.add_argument("--budget-s", type=float, help="the session's time budget (default 600)")
    p.add_argument("--session-duration", type=int, help="seconds per session run (default 40)")
    p.add_argument(
        "--final-check-runs", type=int, help="the session's final check (default 6, as a user's)"
    )
    p.add_argument(
        "--confirm-warmup",
        type=int,
        help="a discarded run before each confirmation run, seconds (default 10)",
    )
    p.add_argument("--warehouses", type=int, help="TPC-C's warehouses (default 2)")
    p.add_argument("--clients", type=int, help="TPC-C's clients (default 4)")
    p.add_argument("--report-clients", type=int, help="the reporting stream's (default 1)")
    p.add_argument(
        "--disk-iops",
        type=int,
        help="both servers' read and write IOPS cap, a cgroup (default 300; 0: none)",
    )
    p.add_argument(
        "--capture-rate",
        type=float,
        help="pgbench -R for each stream of the mix while it is captured, transactions a "
        "second (default: none, flat out; --small: 10)",
    )
    p.add_argument(
        "--report-pause-ms",
        type=int,
        help="the reporting client's pause after each query, ms (default 0; --small: 1500)",
    )
    p.add_argument("--speed", type=float, default=1.0, help="the replay's speed (default 1)")
    p.add_argument(
        "--replay-objective",
        choices=REPLAY_KINDS,
        default="latency_mean",
        help="the replay's level that the checks compare with the original's throughput, "
        "and the session's objective: latency_mean at the captured pace, rate "
        "(the session's throughput) when --speed is faster than any config can go "
        "(default latency_mean)",
    )
    p.add_argument(
        "--session-knobs",
        default=",".join(KNOBS),
        help=f"the session's knobs, comma-separated (default {','.join(KNOBS)}; "
        f"{UNSAFE} is added as a durability trade)",
    )
    p.add_argument(
        "--original-checkpoint",
        action="store_true",
        help="a CHECKPOINT after each original run's reset: every run then starts at a "
        "checkpoint, as every replay run does (its database copy checkpoints)",
    )
    p.add_argument(
        "--original-fresh",
        action="store_true",
        help="each original run's reset makes the database again as a file copy of its "
        "loaded state, as each replay run's does: both sides start from the same physical "
        "data (and at a checkpoint), not the original from tables earlier runs left larger",
    )
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "replay-fidelity.json"))
    p.add_argument(
        "--small",
        action="store_true",
        help="every step at its smallest (a 10 s capture, 1 round of 2 s runs, 1 warehouse, a "
        "10 s session without its final check, no warm-up runs, the captured mix "
        "throttled): a check that the command runs (tests/docs), not a measurement",
    )
    args = p.parse_args()
    for name, value in (SMALL if args.small else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    load_before, t0 = load_average(), time.monotonic()
    started = datetime.now(UTC)
    doc = run(args)
    doc = {
        "machine": machine(),
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "args": vars(args),
        **doc,
        "wall_s": round(time.monotonic() - t0, 1),
        "load_average_1m": {"before": load_before, "after": load_average()},
    }
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    for text in report_lines(doc):
        print(text)
    print(
        f"load average (1 min) {load_before} before, {doc['load_average_1m']['after']} after; "
        f"{doc['wall_s']:.0f} s; written to {args.out}"
    )
    return 0


if __name__ == "__main__":
    run_main(main)
