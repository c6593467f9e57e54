"""Offline verdicts on recorded samples: ``python -m optimizer.replay FILE``.

FILE is a JSON list of cases ``{"incumbent": [[tps, ...], ...], "candidate": [[...], ...]}``;
each inner list is one benchmark run (per-second values, warm-up removed) in the order the
runs ran. A case may also set ``"min_gain"`` and ``"objective"``. For every case one JSON
line ``{"keep": bool, "gain": float, "p_value": float | null}`` is printed, computed by
:func:`optimizer.verdict.judge` with the live optimizer's defaults. A bad file prints one
error line on stderr and exits with status 2 (nothing on stdout).

This is the only module of ``optimizer`` that does I/O: it reads the file it is given.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from optimizer.verdict import Verdict, judge


class ReplayError(ValueError):
    """The input file is not a valid list of replay cases."""


def _runs(case: dict[str, Any], side: str, where: str) -> list[list[float]]:
    runs = case.get(side)
    if not isinstance(runs, list) or not runs:
        raise ReplayError(f"{where}: {side!r} must be a non-empty list of runs")
    out: list[list[float]] = []
    for j, run in enumerate(runs):
        if not isinstance(run, list) or not run:
            raise ReplayError(f"{where}: {side} run {j + 1} must be a non-empty list of numbers")
        for v in run:
            # bool is an int in Python but not a sample
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ReplayError(f"{where}: {side} run {j + 1} has a non-numeric value {v!r}")
            if v < 0:
                raise ReplayError(f"{where}: {side} run {j + 1} has a negative value {v!r}")
        out.append([float(v) for v in run])
    return out


def replay_cases(cases: Any) -> list[Verdict]:
    """Judge every case; ReplayError on malformed input (validated before anything is judged)."""
    if not isinstance(cases, list):
        raise ReplayError("the file must hold a JSON list of cases")
    prepared = []
    for i, case in enumerate(cases):
        where = f"case {i + 1}"
        if not isinstance(case, dict):
            raise ReplayError(f"{where}: must be an object with 'incumbent' and 'candidate'")
        inc, cand = _runs(case, "incumbent", where), _runs(case, "candidate", where)
        min_gain = case.get("min_gain", 0.02)
        if isinstance(min_gain, bool) or not isinstance(min_gain, int | float) or min_gain < 0:
            raise ReplayError(f"{where}: min_gain must be a number >= 0")
        objective = case.get("objective", "throughput")
        if objective not in ("throughput", "latency_p95"):
            raise ReplayError(f"{where}: objective must be 'throughput' or 'latency_p95'")
        prepared.append((inc, cand, float(min_gain), objective))
    out = []
    for i, (inc, cand, min_gain, objective) in enumerate(prepared):
        try:
            out.append(judge(inc, cand, min_gain=min_gain, objective=objective))
        except ValueError as exc:
            raise ReplayError(f"case {i + 1}: {exc}") from exc
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print("usage: python -m optimizer.replay FILE", file=sys.stderr)
        return 2
    path = args[0]
    try:
        with open(path, encoding="utf-8") as fh:
            cases = json.load(fh)
        verdicts = replay_cases(cases)
    except OSError as exc:
        print(f"error: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        print(f"error: {path} is not valid JSON: {exc}", file=sys.stderr)
        return 2
    except (ReplayError, RecursionError) as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 2
    for v in verdicts:
        p = v.p_value if v.p_value is not None and math.isfinite(v.p_value) else None
        print(json.dumps({"keep": v.keep, "gain": v.gain, "p_value": p}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
