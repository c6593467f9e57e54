"""What the bench scripts that measure configs side by side share.

* :func:`interleaved`: configs take turns on one target in rounds, every config once per
  round in an order shuffled anew each round from a seed (randomized interleaved trials,
  as ``knobtune compare`` runs them: app/compare/rounds.py is the one implementation), so
  that whatever drifts within a round (cache, autovacuum, the host's other jobs) does not
  always favour the same one. Each run is the session's own trial (app/sessions/trial.py
  TrialExecutor: apply, a warm-up where asked, the workload's reset, every stream at once,
  per-transaction stats), each config applied on top of the target's settings as they were
  before the first run, and those settings are put back at the end.
* :func:`paired_gain`: the change between two configs from the rounds' log ratios, with
  a 95% interval and the p-value of a paired t test (two-sided): comparing runs of the
  same round cancels slow drift (optimizer/compare.py, as ``knobtune compare`` reports it).
* :func:`machine`, :func:`profile_of` and :func:`load_average`: what the output says about
  the host, the hardware profile a sandbox ran in, and how busy the host was.
* :func:`limits_of`: the limits a script's --profile and its overrides name.
* :func:`run_main`: every bench script's entry point, so that SIGTERM (``kill``, a
  timeout) unwinds like Ctrl-C and the script's sandboxes and cgroups are removed.

Used by bench/e2e.py (the confirmation), bench/capture_overhead.py and
bench/replay_fidelity.py.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable, Mapping
from typing import Any

from app.cli import unwind_on_sigterm
from app.compare.rounds import knob_names, run_rounds
from app.postgres.cgroups import PROFILES, Limits, resolve
from app.postgres.target import TargetController
from app.sessions.trial import TrialExecutor, TrialOutcome
from optimizer import compare
from optimizer.evidence import StreamStat

OnRun = Callable[[int, str, TrialOutcome], None]


def round_orders(labels: list[str], rounds: int, seed: int = 0) -> list[list[str]]:
    """Per round, the configs in the order they run (shuffled per round from ``seed``)."""
    return [[labels[i] for i in o] for o in compare.round_orders(len(labels), rounds, seed)]


def interleaved(
    ctl: TargetController,
    executor: TrialExecutor,
    configs: Mapping[str, Mapping[str, str]],
    rounds: int,
    on_run: OnRun,
    seed: int = 0,
) -> None:
    """``rounds`` rounds of every config in ``configs`` ({label: {knob: value}}), each
    round's order shuffled from ``seed`` (:func:`round_orders`); ``on_run(round, label,
    outcome)`` after each run (it may raise to stop). The target's settings are put back
    at the end, whatever happened."""
    snapshot = ctl.snapshot(knob_names(configs))
    orders = round_orders(list(configs), rounds, seed)
    try:
        run_rounds(
            ctl,
            executor,
            configs,
            orders,
            snapshot,
            lambda _i, rnd, label, out, _s: on_run(rnd, label, out),
        )
    finally:
        ctl.revert(snapshot)


def measured(out: TrialOutcome, what: str) -> tuple[StreamStat, ...]:
    """The run's streams; RuntimeError "``what`` failed: why" when it failed or a stream
    logged nothing."""
    done = out.measurement.streams
    if out.error is not None or not done:
        why = out.error or "a stream logged no transaction"
        raise RuntimeError(f"{what} failed: {why}")
    return tuple(done)


def paired_gain(
    c: list[float | None], ref: list[float | None], lower_is_better: bool = False
) -> dict[str, Any]:
    """Gain of c over ref from per-round log ratios of levels, JSON-ready: ``knobtune
    compare``'s statistic (optimizer/compare.py ``paired_gain``)."""
    return compare.paired_gain(c, ref, lower_is_better).to_json()


def shown(est: Mapping[str, Any]) -> str:
    """A :func:`paired_gain` estimate as text: "+12.3% [+4.0%, +21.2%] p=0.012"."""
    return compare.gain_text(est)


def machine() -> dict[str, Any]:
    """The host: CPUs, memory, Python, platform."""
    return {
        "cpus": os.cpu_count(),
        "ram_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def profile_of(limits: Limits | None) -> dict[str, Any] | None:
    """The hardware profile a sandbox ran in (None: the host as it is)."""
    if limits is None:
        return None
    named = PROFILES.get(limits.profile or "")
    return {
        "name": limits.profile,
        "limits": limits.to_json(),
        "describe": limits.describe(),
        "models": named.models if named else None,
    }


def limits_of(args: Any) -> Limits | None:
    """The limits of a bench script's --profile and its --memory, --disk-iops, --disk-mbps
    and --cpus overrides (None: neither given, the host as it is)."""
    given = {
        k: v
        for k in ("memory", "disk_iops", "disk_mbps", "cpus")
        if (v := getattr(args, k, None)) is not None
    }
    return resolve(profile=args.profile, **given) if args.profile or given else None


def load_average() -> float:
    """The host's 1-minute load average now: other work on the machine adds noise."""
    return round(os.getloadavg()[0], 2)


def run_main(main: Callable[[], int | None]) -> None:
    """Run a bench script's ``main`` and exit with its status. SIGTERM unwinds like Ctrl-C,
    as for the CLI (app/cli unwind_on_sigterm): a killed bench (``pkill``, ``timeout``)
    left its sandbox running and its cgroup in place."""
    unwind_on_sigterm()
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
