"""Duet runs against sequential runs: do they cut the noise of a verdict on a small server?

A verdict compares a candidate's runs with the incumbent's. Run one after the other on one
server (sequential, as sessions and ``knobtune compare`` run them), the two sides meet
whatever the host did in between. Duet runs (Bulej et al., ICPE 2020, who report 5-37x
more accurate comparisons) run both sides *at the same time* on two identical copies of
the server under equal caps, so that the host's noise falls on both alike. The rule for
the product: adopt duet runs only if they cut the verdict's noise at least 3x on profile
``small``.

The two copies: copy 1 is a sandbox in the profile's cgroup with the workload's data loaded
there (bench/e2e.py ``make_sandbox``); copy 2 is a second sandbox with its own cgroup and
the same limits, whose data directory is replaced by a file copy of copy 1's, made after a
CHECKPOINT with both servers stopped (``cp -a`` run inside copy 2's cgroup, so its page
cache counts against copy 2's memory as copy 1's load did against copy 1's). Copy 2 keeps
its own port and socket directory and takes copy 1's passwords with its catalog.

Measured, in pairs (each run: ``--warmup-s`` seconds discarded, then ``--run-s`` measured;
a run's level is the verdict's, from its transactions, app/compare/rounds.py ``run_record``):

* **sequential A/A**: the same config twice on copy 1, one run after the other; which run
  is "A" alternates from pair to pair;
* **duet A/A**: the same config on both copies at once (two pgbench processes whose
  measured runs start together); which copy is "A" alternates, and copy 1 against copy 2
  is reported as its own bias (a fixed difference between the copies);
* **the known effect** (``--effect-pairs``, 0: none): shared_buffers 128MB against a larger
  pool (``--large-pool``, default half the profile's memory), sequentially on copy 1 and as
  a duet, to see that a duet keeps an effect's size, and each mode's level (a duet shares
  the host, so both servers may run slower).

A/A pairs of the two modes alternate, then the effect's pairs do, so that both modes meet
the same hours of the host. Reported per mode: pairs, the mean and sd of the A/A log ratio,
the 95% interval of the A/A difference and its p-value (``knobtune compare``'s statistic,
optimizer/compare.py ``paired_gain``), the position bias (first run against second; copy 1
against copy 2) and the sd without it, each run's level; then the ratio of the sds
(sequential / duet) with a 95% interval (F distribution), against the 3x rule.

    .venv/bin/python bench/duet.py --profile small --pairs 8 --run-s 30 --warmup-s 5 \\
        --effect-pairs 1 --out bench/results/duet-small.json

takes about 18 minutes (at most 20): loading scale 50 and copying it about 1.5, the runs
16.5 (28 runs of 35 s), one warm-up after a restart up to 1.75. Each more effect pair adds
3 runs and up to two warm-ups (about 5 minutes).

``--small``: scale 1, 2 clients, 2 pairs of 2 s runs (none discarded) and one effect pair,
pgbench throttled to bench/e2e.py's ``SMALL_RATE`` tps on each copy: a check that the
command runs (tests/docs), not a measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.compare.rounds import run_record  # noqa: E402
from app.postgres.cgroups import PROFILES, launcher_argv  # noqa: E402
from app.postgres.sandbox import Sandbox, as_postgres  # noqa: E402
from app.postgres.target import TargetController  # noqa: E402
from app.sessions.trial import TrialExecutor, TrialHooks, TrialOutcome  # noqa: E402
from app.workloads import workload_for  # noqa: E402
from app.workloads.schemas import WorkloadIn  # noqa: E402
from bench.common import limits_of, load_average, machine, profile_of, run_main  # noqa: E402
from bench.e2e import SMALL_RATE, in_cgroup, make_sandbox, small_workload  # noqa: E402
from optimizer.compare import gain_text, paired_gain, summarize  # noqa: E402
from optimizer.descent import Candidate  # noqa: E402
from optimizer.evidence import Objective  # noqa: E402

THROUGHPUT = Objective(kind="throughput")
RULE = 3.0  # the sd ratio (sequential / duet) at which duet runs are adopted
SMALL_POOL = "128MB"  # PostgreSQL's own shared_buffers
MODES = ("sequential_aa", "duet_aa", "sequential_effect", "duet_effect")
Config = Mapping[str, str]
Run = dict[str, Any]


class Copy:
    """One copy of the server and the trial executor that runs the workload on it."""

    def __init__(
        self, name: str, sb: Sandbox, spec: dict[str, Any], args: argparse.Namespace
    ) -> None:
        self.name, self.sb = name, sb
        self.ctl = TargetController.for_sandbox(sb)
        workload = workload_for(WorkloadIn.model_validate({**spec["workload"], "duration_s": 60}))
        # the session's trial executor: apply (a restart, then a warm-up until the pool is
        # warm, where shared_buffers changes), the workload's reset, every stream at once
        self.executor = TrialExecutor(
            self.ctl,
            sb.dsn,
            workload,
            duration_s=args.run_s + args.warmup_s,
            warmup_s=args.warmup_s,
            rate=args.rate,  # --small: throttled (pgbench -R)
            stop=args.stop,
        )
        self.runs = 0

    def run(self, config: Config, label: str, hooks: TrialHooks | None = None) -> Run:
        """One measured run of ``config``: its record, or RuntimeError when it failed."""
        self.executor.hooks = hooks or TrialHooks()
        cand = Candidate(self.runs, dict(config), None, label, "baseline")  # no guard acts
        self.runs += 1
        out: TrialOutcome = self.executor.run(cand, incumbent=dict(config))
        rec = run_record(out, THROUGHPUT)
        if rec["error"] is not None or rec["level"] is None:
            raise RuntimeError(f"{self.name}, {label}: {rec['error'] or 'no level'}")
        return {
            "copy": self.name,
            "label": label,
            "config": dict(config),
            # what the server ran with, as it reports it
            "shared_buffers": self.ctl.snapshot(["shared_buffers"]).effective["shared_buffers"],
            "level": round(rec["level"], 2),
            "transactions": rec["transactions"],
            "io": rec["io"],
            "timings": rec["timings"],
            "started_at": rec["started_at"],
        }


def duet(
    c1: Copy, k1: Config, c2: Copy, k2: Config, labels: tuple[str, str], timeout_s: float
) -> list[Run]:
    """Both copies at once, copy 1 running ``k1`` and copy 2 ``k2`` (``labels``: what each
    run is called): each applies its config and warms up where that restarted it, then the
    two measured runs start together (a barrier as each begins; ``start_skew_s`` says how
    far apart they began). A side that fails releases the other (the barrier breaks)."""
    barrier = threading.Barrier(2)
    began: list[float] = [0.0, 0.0]
    done: list[Run | None] = [None, None]
    failed: list[BaseException | None] = [None, None]

    def side(i: int, copy: Copy, config: Config) -> None:
        def start() -> None:
            barrier.wait(timeout=timeout_s)
            began[i] = time.monotonic()

        try:
            done[i] = copy.run(config, labels[i], TrialHooks(on_run_start=start))
        except BaseException as exc:  # reported by the caller's thread
            failed[i] = exc
        finally:
            barrier.abort()  # both passed it already, or the other must not wait on

    threads = [
        threading.Thread(target=side, args=(i, c, k), daemon=True)
        for i, (c, k) in enumerate(((c1, k1), (c2, k2)))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # the side that failed first says why; the other only saw the barrier break
    for exc in sorted(
        (e for e in failed if e is not None),
        key=lambda e: isinstance(e, threading.BrokenBarrierError),
    ):
        raise RuntimeError(f"duet {'/'.join(labels)}: {exc!r}") from exc
    if done[0] is None or done[1] is None:
        raise RuntimeError(f"duet {'/'.join(labels)}: a side never started its measured run")
    skew = round(abs(began[0] - began[1]), 3)
    return [{**r, "start_skew_s": skew} for r in done if r is not None]


def clone(src: Sandbox, dst: Sandbox) -> dict[str, Any]:
    """``dst``'s data directory replaced by a file copy of ``src``'s (both stopped after a
    CHECKPOINT), made inside ``dst``'s cgroup; ``dst`` keeps its port and socket directory
    and takes ``src``'s passwords (they are in the catalog it copied). Both started again."""
    with psycopg.connect(src.dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
    src.stop()
    dst.stop()
    t = time.monotonic()
    cg = dst.cgroup
    for argv in (
        as_postgres(["find", str(dst.data_dir), "-mindepth", "1", "-delete"]),
        as_postgres(["cp", "-a", f"{src.data_dir}/.", f"{dst.data_dir}/"]),
    ):
        if cg is not None:
            dst.ensure_cgroup()
            argv = launcher_argv(cg.procs_files(), argv)
        res = subprocess.run(argv, capture_output=True, text=True, timeout=3600, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"copying the data directory failed: {res.stderr.strip()}")
    seconds = round(time.monotonic() - t, 1)
    dst.move_to(dst.port)  # knobtune_sandbox.conf came from src: its own port and socket again
    dst.password, dst.bench_password = src.password, src.bench_password
    src.start()
    dst.start()
    size = sum(
        f.stat().st_size for f in dst.data_dir.rglob("*") if f.is_file() and not f.is_symlink()
    )
    return {
        "method": "file copy (cp -a) of copy 1's data directory, both servers stopped after a "
        "CHECKPOINT, run inside copy 2's cgroup",
        "seconds": seconds,
        "bytes": size,
    }


# -- statistics ------------------------------------------------------------------------------
def _sd(x: Sequence[float]) -> float | None:
    return round(float(np.std(x, ddof=1)), 5) if len(x) > 1 else None


def pair_summary(
    a: list[float], b: list[float], first: list[float], second: list[float], position: str
) -> dict[str, Any]:
    """One mode's pairs: ``a``/``b`` the levels labelled A and B (the label alternating
    between positions), ``first``/``second`` the same levels by position (``position``
    says what the positions are). The A/A difference is ``knobtune compare``'s paired gain;
    the position bias is the same statistic by position, and its sd is the noise once a
    fixed difference between the positions is taken out."""
    d = np.log(a) - np.log(b)
    runs = np.log([*a, *b])
    level = summarize({"runs": [*a, *b]})["runs"]
    return {
        "pairs": len(a),
        "mean_log_ratio": round(float(d.mean()), 5),
        "sd_log_ratio": _sd(d.tolist()),
        "difference": paired_gain(a, b).to_json(),
        "position": {
            "what": position,
            "bias": paired_gain(first, second).to_json(),
            "sd_log_ratio": _sd((np.log(first) - np.log(second)).tolist()),
        },
        "run_log_sd": _sd(runs.tolist()),
        "level_tps": {"median": level["median"], "ci95": level["ci95"]},
    }


def sd_ratio(seq: float | None, n_seq: int, duet_: float | None, n_duet: int) -> dict[str, Any]:
    """sequential sd / duet sd with its 95% interval (the ratio of two sample variances
    follows an F distribution), and where it lies against the 3x rule."""
    if seq is None or duet_ is None or duet_ <= 0 or n_seq < 2 or n_duet < 2:
        return {"ratio": None, "ci95": None, "against_rule": "not measured"}
    r2 = (seq / duet_) ** 2
    f = stats.f(n_seq - 1, n_duet - 1)
    low, high = math.sqrt(r2 / f.ppf(0.975)), math.sqrt(r2 / f.ppf(0.025))
    if low >= RULE:
        said = f"at least {RULE:g}x (the interval's low end is {low:.2f})"
    elif high < RULE:
        said = f"below {RULE:g}x (the interval's high end is {high:.2f})"
    else:
        said = f"undecided: the interval holds {RULE:g}x"
    return {
        "ratio": round(math.sqrt(r2), 3),
        "ci95": [round(low, 3), round(high, 3)],
        "against_rule": said,
    }


def effect_summary(small: list[float], large: list[float]) -> dict[str, Any]:
    """The larger pool against 128MB, paired by pair, and each side's level."""
    levels = summarize({"small_pool": small, "large_pool": large})
    d = np.log(large) - np.log(small)
    return {
        "pairs": len(small),
        "gain": paired_gain(large, small).to_json(),
        "sd_log_ratio": _sd(d.tolist()),
        "level_tps": {k: {"median": v["median"], "ci95": v["ci95"]} for k, v in levels.items()},
    }


# -- the measurement -------------------------------------------------------------------------
class Results:
    """Every pair as it is measured, written to --out after each one (a long run that
    fails late keeps what it measured)."""

    def __init__(self, out: Path, head: dict[str, Any]) -> None:
        self.out, self.doc = out, head
        self.doc["pairs"] = {m: [] for m in MODES}
        self.doc["complete"] = False

    def add(self, mode: str, pair: dict[str, Any]) -> None:
        self.doc["pairs"][mode].append(pair)
        runs = " ".join(f"{r['copy']}:{r['label']}={r['level']:.0f}" for r in pair["runs"])
        print(f"  {mode} pair {pair['pair'] + 1}: {runs} tps", file=sys.stderr)
        self.write()

    def write(self) -> None:
        self.out.write_text(json.dumps(self.doc, indent=2) + "\n")


def aa_pairs(c1: Copy, c2: Copy, args: argparse.Namespace, res: Results) -> None:
    """Sequential and duet A/A pairs, alternating; "A" swaps position every other pair
    (``a_is``: the index in ``runs`` of the run labelled A)."""
    for i in range(args.pairs):
        a_is = i % 2
        labels = ("B", "A") if a_is else ("A", "B")
        runs = [c1.run({}, labels[0]), c1.run({}, labels[1])]
        res.add("sequential_aa", {"pair": i, "a_is": a_is, "runs": runs})
        runs = duet(c1, {}, c2, {}, labels, args.barrier_s)
        res.add("duet_aa", {"pair": i, "a_is": a_is, "runs": runs})


def effect_pairs(
    c1: Copy, c2: Copy, pools: dict[str, Config], args: argparse.Namespace, res: Results
) -> None:
    """The pool sizes sequentially on copy 1 (small then large in even pairs, the other way
    in odd ones) and as a duet (copy 1 large in even pairs). Each duet starts where the
    sequential pair left copy 1, so every pair restarts one server, as a verdict between a
    restarted candidate and a warm incumbent does."""
    for i in range(args.effect_pairs):
        order = ("small_pool", "large_pool") if i % 2 == 0 else ("large_pool", "small_pool")
        runs = [c1.run(pools[name], name) for name in order]
        res.add("sequential_effect", {"pair": i, "runs": runs})
        both = (order[1], order[0])  # copy 1 goes on with the config it has
        runs = duet(c1, pools[both[0]], c2, pools[both[1]], both, args.barrier_s)
        res.add("duet_effect", {"pair": i, "runs": runs})


def summarize_pairs(pairs: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Every mode's summary, the sd ratios against the rule, the effect in each mode."""
    out: dict[str, Any] = {}
    for mode, position in (
        ("sequential_aa", "first run / second run"),
        ("duet_aa", "copy 1 / copy 2"),
    ):
        rows = pairs[mode]
        if not rows:
            continue
        first = [r["runs"][0]["level"] for r in rows]
        second = [r["runs"][1]["level"] for r in rows]
        a = [r["runs"][r["a_is"]]["level"] for r in rows]
        b = [r["runs"][1 - r["a_is"]]["level"] for r in rows]
        out[mode] = pair_summary(a, b, first, second, position)
    if "sequential_aa" in out and "duet_aa" in out:
        s, d = out["sequential_aa"], out["duet_aa"]
        out["sd_ratio"] = sd_ratio(s["sd_log_ratio"], s["pairs"], d["sd_log_ratio"], d["pairs"])
        out["sd_ratio_without_position_bias"] = sd_ratio(
            s["position"]["sd_log_ratio"], s["pairs"], d["position"]["sd_log_ratio"], d["pairs"]
        )
        seq_level, duet_level = s["level_tps"]["median"], d["level_tps"]["median"]
        out["duet_level_vs_sequential"] = round(duet_level / seq_level, 3) if seq_level else None
    for mode in ("sequential_effect", "duet_effect"):
        rows = pairs[mode]
        if rows:
            by = [{r["label"]: r["level"] for r in row["runs"]} for row in rows]
            out[mode] = effect_summary([x["small_pool"] for x in by], [x["large_pool"] for x in by])
    return out


def _pct(g: Mapping[str, Any]) -> str:
    return gain_text(g) if g["gain"] is not None else "-"


def table(summary: Mapping[str, Any]) -> str:
    """The printed table: one row per mode, then the ratio of the sds against the rule."""
    interval = "95% interval (A/A difference or effect)"
    head = f"{'mode':<18} {'pairs':>5} {'mean log':>9} {'sd log':>8}  {interval:<44} level tps"
    lines = [head, "-" * len(head)]
    for mode in MODES:
        m = summary.get(mode)
        if m is None:
            continue
        if mode.endswith("_aa"):
            mean, interval = f"{m['mean_log_ratio']:+.4f}", _pct(m["difference"])
            level = f"{m['level_tps']['median']}"
        else:
            g = m["gain"]
            mean = "-" if g["gain"] is None else f"{math.log1p(g['gain']):+.4f}"
            interval = _pct(g)
            lv = m["level_tps"]
            level = f"{lv['small_pool']['median']} / {lv['large_pool']['median']} (128MB / large)"
        sd = "-" if m["sd_log_ratio"] is None else f"{m['sd_log_ratio']:.4f}"
        lines.append(f"{mode:<18} {m['pairs']:>5} {mean:>9} {sd:>8}  {interval:<44} {level}")
    for mode in ("sequential_aa", "duet_aa"):
        if mode in summary:
            pos = summary[mode]["position"]
            lines.append(f"{mode} position bias ({pos['what']}): {_pct(pos['bias'])}")
    for key, what in (
        ("sd_ratio", "sd ratio sequential / duet"),
        ("sd_ratio_without_position_bias", "the same, position bias taken out"),
    ):
        r = summary.get(key)
        if r and r["ratio"] is not None:
            lines.append(
                f"{what}: {r['ratio']:.2f} [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]"
                f" ({r['against_rule']})"
            )
    return "\n".join(lines)


# -- the script -------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="small",
        help="the hardware profile both copies run in (docs/profiles.md)",
    )
    p.add_argument("--memory", help="the profile's memory replaced, e.g. 2GB")
    p.add_argument("--disk-iops", type=int, help="the profile's disk IOPS replaced")
    p.add_argument("--disk-mbps", type=int, help="the profile's disk MB/s replaced")
    p.add_argument("--cpus", type=int, help="the profile's CPUs replaced")
    p.add_argument("--scale", type=int, default=50, help="pgbench tpcb-like scale (default 50)")
    p.add_argument("--clients", type=int, default=8, help="pgbench clients per copy")
    p.add_argument("--pairs", type=int, default=8, help="A/A pairs of each mode (default 8)")
    p.add_argument(
        "--effect-pairs",
        type=int,
        default=1,
        help="pairs of 128MB against --large-pool in each mode (0: none)",
    )
    p.add_argument("--large-pool", help="the larger shared_buffers (default: half the memory)")
    p.add_argument("--run-s", type=int, default=30, help="measured seconds per run")
    p.add_argument(
        "--warmup-s", type=int, default=5, help="seconds discarded at the start of every run"
    )
    p.add_argument("--out", help="the JSON file (default bench/results/duet-PROFILE.json)")
    p.add_argument(
        "--small",
        action="store_true",
        help=f"scale 1, 2 clients, 2 pairs of 2 s runs, one effect pair, {SMALL_RATE} tps "
        "(pgbench -R): a check that the command runs (tests/docs), not a measurement",
    )
    return p


def parse_args(p: argparse.ArgumentParser) -> argparse.Namespace:
    args = p.parse_args()
    # --small's runs throttled: they check the path, never a level, and flat out two copies
    # kept both of the host's CPUs busy (the suite's other workers wait for them)
    args.rate = SMALL_RATE if args.small else None
    if args.small:
        args.scale, args.clients = 1, 2
        args.pairs, args.effect_pairs = min(args.pairs, 2), min(args.effect_pairs, 1)
        args.run_s, args.warmup_s = min(args.run_s, 2), 0
    if args.pairs < 2:
        p.error(f"--pairs must be 2 or more (an sd needs two pairs), not {args.pairs}")
    if args.effect_pairs < 0 or args.run_s < 1 or args.warmup_s < 0:
        p.error("--effect-pairs and --warmup-s must be 0 or more, --run-s 1 or more")
    args.out = args.out or str(ROOT / "bench" / "results" / f"duet-{args.profile}.json")
    return args


def _plan_s(args: argparse.Namespace) -> tuple[float, float]:
    """Seconds the runs take, without and with the longest warm-ups: three runs per pair of
    either kind (two sequential, one duet) and the settling run; each effect pair restarts
    one server (the first duet none), whose warm-up lasts at most 3 runs."""
    run = args.run_s + args.warmup_s
    runs = run * (3 * (args.pairs + args.effect_pairs) + 1)
    restarts = args.effect_pairs + max(0, args.effect_pairs - 1)
    return float(runs), float(runs + restarts * 3 * run)


def main() -> int:
    args = parse_args(parser())
    limits = limits_of(args)
    assert limits is not None  # --profile always names one
    memory = limits.memory_bytes or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    pools: dict[str, Config] = {
        "small_pool": {"shared_buffers": SMALL_POOL},
        "large_pool": {"shared_buffers": args.large_pool or f"{memory // 2 // 2**20}MB"},
    }
    wl: dict[str, Any] = {
        "builtin": "tpcb-like",
        "scale": args.scale,
        "clients": args.clients,
        "jobs": min(2, args.clients),
    }
    spec = {"workload": small_workload(wl) if args.small else wl}
    w = spec["workload"]
    description = (
        f"pgbench tpcb-like, scale {w['scale']}, {w['clients']} clients, {w['jobs']} job(s)"
    )
    # a side waits this long at most for the other's measured run to begin (its apply,
    # restart and warm-up: at most 3 runs)
    args.barrier_s = 4 * (args.run_s + args.warmup_s) + 300
    args.stop = threading.Event()
    least, most = _plan_s(args)
    print(
        f"duet: {description}, profile {limits}; the runs take {least / 60:.0f}-"
        f"{most / 60:.0f} min after the load (the longer with the longest warm-ups)",
        file=sys.stderr,
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    load_before = load_average()
    with contextlib.ExitStack() as stack:
        sb1, load = make_sandbox(spec, limits, argparse.Namespace())
        stack.enter_context(sb1)
        sb2 = stack.enter_context(Sandbox.create(limits=limits))
        # first on the way out: a run still going in a duet's thread stops its pgbench
        stack.callback(args.stop.set)
        copied = clone(sb1, sb2)
        print(
            f"  copy 2: {copied['bytes'] / 2**30:.2f} GiB copied in {copied['seconds']} s",
            file=sys.stderr,
        )
        c1, c2 = Copy("copy1", sb1, spec, args), Copy("copy2", sb2, spec, args)
        res = Results(
            out,
            {
                "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                "machine": machine(),
                "args": {k: v for k, v in vars(args).items() if k != "stop"},
                "workload": description,
                "profile": profile_of(limits),
                "data": load,
                "copy": copied,
                "cgroups": {c.name: in_cgroup(c.sb) for c in (c1, c2)},
                "configs": {"aa": {}, **pools},
                "rule": f"adopt duet runs if they cut the A/A log ratio's sd at least {RULE:g}x",
            },
        )
        # both copies run the workload once before the pairs (the copy's cache is the
        # file copy's, copy 1's the load's): discarded
        try:
            res.doc["settle"] = duet(c1, {}, c2, {}, ("settle", "settle"), args.barrier_s)
            aa_pairs(c1, c2, args, res)
            effect_pairs(c1, c2, pools, args, res)
        except BaseException as exc:
            # what was measured stays, with what ended it
            res.doc["error"] = repr(exc)
            res.doc["summary"] = summarize_pairs(res.doc["pairs"])
            res.write()
            raise
        res.doc["cgroups_after"] = {c.name: in_cgroup(c.sb) for c in (c1, c2)}
    res.doc["summary"] = summarize_pairs(res.doc["pairs"])
    res.doc["load_average_1m"] = {"before": load_before, "after": load_average()}
    res.doc["complete"] = True
    res.write()
    print(table(res.doc["summary"]))
    print(f"written: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main(main)
