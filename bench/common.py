"""What the bench scripts that measure configs side by side share.

* :func:`interleaved`: configs take turns on one target in rounds whose order rotates
  (two configs: A B, B A, A B, ... = A B B A A B; three: A B C, B C A, C A B), so that
  whatever drifts within a round (cache, autovacuum, the host's other jobs) does not always
  favour the same one. Each run is the session's own trial (app/runs/trial.py
  TrialExecutor: apply, a warm-up where asked, the workload's reset, every stream at once,
  per-transaction stats), each config applied on top of the target's settings as they were
  before the first run, and those settings are put back at the end.
* :func:`paired_gain`: the change between two configs from the rounds' log ratios, with
  a 95% interval and the p-value of a paired t test (two-sided): comparing runs of the
  same round cancels slow drift.
* :func:`machine`, :func:`profile_of` and :func:`load_average`: what the output says about
  the host, the hardware profile a sandbox ran in, and how busy the host was.
* :func:`run_main`: every bench script's entry point, so that SIGTERM (``kill``, a
  timeout) unwinds like Ctrl-C and the script's sandboxes and cgroups are removed.

Used by bench/e2e.py (the confirmation), bench/capture_overhead.py and
bench/replay_fidelity.py.
"""

from __future__ import annotations

import math
import os
import platform
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from scipy import stats

from app.cli import unwind_on_sigterm
from app.postgres.cgroups import PROFILES, Limits
from app.postgres.target import TargetController
from app.runs.trial import TrialExecutor, TrialOutcome
from optimizer.descent import Candidate
from optimizer.evidence import StreamStat

OnRun = Callable[[int, str, TrialOutcome], None]


def interleaved(
    ctl: TargetController,
    executor: TrialExecutor,
    configs: Mapping[str, Mapping[str, str]],
    rounds: int,
    on_run: OnRun,
) -> None:
    """``rounds`` rounds of every config in ``configs`` ({label: {knob: value}}), in
    rotating order; ``on_run(round, label, outcome)`` after each run (it may raise to
    stop). The target's settings of every knob named are put back at the end, whatever
    happened."""
    names = sorted({k for c in configs.values() for k in c})
    snapshot = ctl.snapshot(names)
    labels = list(configs)
    n = 0
    try:
        for rnd in range(rounds):
            k = rnd % len(labels)
            for label in labels[k:] + labels[:k]:
                config = dict(configs[label])
                ctl.revert(snapshot)
                # role "baseline": measured as it is, no guard stops or refuses it
                out = executor.run(Candidate(n, config, None, None, "baseline"), incumbent=config)
                n += 1
                on_run(rnd, label, out)
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
    """Gain of c over ref from per-round log ratios of levels (levels: higher is better),
    over the rounds where both runs are complete.

    ``lower_is_better``: the objective is a time; the gain is the fraction of time saved.
    Given any positive quantity (a latency, a volume), the "gain" is its paired change:
    the geometric mean of the rounds' ratios, minus 1.
    """
    pairs = [(x, y) for x, y in zip(c, ref, strict=True) if x is not None and y is not None]
    if not pairs:
        return {"gain": None, "ci95": None, "p_value": None, "rounds": 0}
    d = np.log(np.array([x for x, _ in pairs])) - np.log(np.array([y for _, y in pairs]))
    n = d.size
    mean, sd = float(d.mean()), float(d.std(ddof=1)) if n > 1 else 0.0
    half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n) if n > 1 and sd > 0 else 0.0
    p = float(stats.ttest_1samp(d, 0.0).pvalue) if n > 1 and sd > 0 else None

    def gain(x: float) -> float:
        return round(-math.expm1(-x) if lower_is_better else math.expm1(x), 4)

    return {
        "gain": gain(mean),
        "ci95": [gain(mean - half), gain(mean + half)],
        "p_value": None if p is None else round(p, 5),
        "rounds": n,
    }


def shown(est: Mapping[str, Any]) -> str:
    """A :func:`paired_gain` estimate as text: "+12.3% [+4.0%, +21.2%] p=0.012"."""
    if est["gain"] is None:
        return "not measured"
    low, high = est["ci95"]
    p = "" if est["p_value"] is None else f" p={est['p_value']:.3g}"
    return f"{est['gain']:+.1%} [{low:+.1%}, {high:+.1%}]{p}"


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


def load_average() -> float:
    """The host's 1-minute load average now: other work on the machine adds noise."""
    return round(os.getloadavg()[0], 2)


def run_main(main: Callable[[], int | None]) -> None:
    """Run a bench script's ``main`` and exit with its status. SIGTERM unwinds like Ctrl-C,
    as for the CLI (app/cli.py unwind_on_sigterm): a killed bench (``pkill``, ``timeout``)
    left its sandbox running and its cgroup in place."""
    unwind_on_sigterm()
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
